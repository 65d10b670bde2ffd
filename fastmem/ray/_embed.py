"""Re-embedding with one model per node: a ``reembed`` job's shards on a node share one
embedder actor (``fastmem-embed-<job>-<node>``) that loads the model once and encodes one
batch at a time, instead of each shard loading its own copy (a model is ~100 MB-1 GB)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._config import RAY_NAMESPACE


class EmbedService:
    """The actor: builds the embedder from its factory once; encodes batches."""

    def __init__(self, factory: Callable[[], Any] | None) -> None:
        from ..embed import default_embedder

        self.embedder = factory() if factory is not None else default_embedder()
        wait = getattr(self.embedder, "wait", None)
        if wait is not None:
            wait()

    def info(self) -> tuple[str, int]:
        return str(self.embedder.name), int(self.embedder.dim)

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self.embedder.encode(texts), dtype=np.float32)


class RemoteEmbedder:
    """An ``Embedder`` whose ``encode`` runs in the node's embed actor."""

    def __init__(self, actor: Any) -> None:
        import ray

        self.actor = actor
        self.name, self.dim = ray.get(actor.info.remote())

    def encode(self, texts: list[str]) -> np.ndarray:
        import ray

        result: np.ndarray = ray.get(self.actor.encode.remote(list(texts)))
        return result


def service_name(job: str, node_id: str) -> str:
    return f"fastmem-embed-{job}-{node_id[:16]}"


def embedder_on_node(job: str, node_id: str, factory: Callable[[], Any] | None) -> RemoteEmbedder:
    """The embed actor of ``job`` on node ``node_id`` (made by the first shard that asks)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(EmbedService).options(
        name=service_name(job, node_id), namespace=RAY_NAMESPACE, get_if_exists=True,
        lifetime="detached", num_cpus=0, max_concurrency=1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(factory)  # fmt: skip
    return RemoteEmbedder(actor)


def stop_services(job: str) -> int:
    """Stop the embed actors of ``job`` (the job runner does, when the job ends)."""
    import ray

    stopped = 0
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry.get("namespace") == RAY_NAMESPACE and entry["name"].startswith(f"fastmem-embed-{job}-"):
            try:
                ray.kill(ray.get_actor(entry["name"], namespace=RAY_NAMESPACE), no_restart=True)
                stopped += 1
            except ValueError:
                pass  # stopped meanwhile
    return stopped
