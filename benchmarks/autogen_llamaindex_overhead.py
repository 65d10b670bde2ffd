"""What the AutoGen and LlamaIndex adapters cost over the fastmem calls they wrap, and how
AutoGen's memories compare on one workload.

    python benchmarks/autogen_llamaindex_overhead.py [--memories 1000] [--calls 200]

One store of ``--memories`` short facts about made-up people (the default embedder:
all-MiniLM-L6-v2, int8), then, in one process and one event loop:

* **adapter overhead** — each adapter call against the core call it wraps, called directly
  (synchronously, on the loop's thread, with the arguments the adapter passes it):
  ``FastmemMemory.add`` / ``MemoryStore.add``,
  ``FastmemMemory.query`` / ``MemoryStore.search``, ``FastmemMemory.update_context`` /
  ``MemoryStore.context``, ``FastmemMemoryBlock.aget`` / ``MemoryStore.context`` and
  ``FastmemMemoryBlock.aput`` (4 messages) / ``MemoryStore.add_many``. Adapter and core
  calls alternate, each with a question never asked before (fastmem caches query
  embeddings), and the overhead is the median of the pairs' differences over the core
  call's median. The adapter's cost is
  mostly its hop to a worker thread (``asyncio.to_thread``), which keeps the event loop free.
* **AutoGen's memories** — ``query`` and ``update_context`` of ``FastmemMemory`` (its
  default 1,300-token context, and a 100-token one: about Chroma's five facts),
  ``ListMemory`` and (when ``chromadb`` is installed: the ``bench`` extra)
  ``ChromaDBVectorMemory``, all holding the same facts; Chroma embeds with fastmem's own
  model (a custom embedding function), so both vector sides compute the same vectors.
  ``update_context`` is also reported in tokens added to the model's input (cl100k_base).

Figures are medians (p50; the peers' rows also p90) over ``--calls`` calls, in ms. The
overhead rows give wall time (what the caller waits) and the process's CPU time over all
threads (the work done): on a loaded machine a woken worker thread waits for a core, which
the wall time counts and the CPU time does not.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import fastmem
import fastmem.embed
from fastmem.tokens import TokenCounter

NAMES = ["Ada", "Bruno", "Chen", "Dalia", "Emeka", "Freya", "Goran", "Hana", "Ivo", "Jonas",
         "Kemal", "Lucia", "Mateo", "Nadia", "Oskar", "Priya", "Quinn", "Rosa", "Sven", "Tariq"]
THINGS = ["cat", "bicycle", "garden", "violin", "boat", "camera", "piano", "kayak", "laptop",
          "tent", "guitar", "telescope", "sourdough starter", "motorbike", "aquarium"]
PLACES = ["Lisbon", "Oslo", "Kyoto", "Quito", "Tunis", "Perth", "Riga", "Lima", "Cork", "Pune",
          "Bergen", "Dakar", "Hanoi", "Split", "Tartu", "Cusco", "Leeds", "Basel", "Izmir"]
TEMPLATES = [
    "{name} keeps a {thing} at the flat in {place} and uses it every weekend.",
    "{name} moved to {place} in {year} and still misses the old {thing}.",
    "The {thing} that {name} bought in {place} cost {n} euros.",
    "{name} said the {thing} broke during the trip to {place} in {year}.",
    "{name}'s favourite memory of {place} involves a borrowed {thing}.",
]


def facts(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [
        rng.choice(TEMPLATES).format(
            name=rng.choice(NAMES), thing=rng.choice(THINGS), place=rng.choice(PLACES),
            year=rng.randint(1990, 2025), n=rng.randint(20, 3000),
        )
        for _ in range(count)
    ]


def questions(seed: int) -> Iterator[str]:
    """Questions never asked before (a running number makes each one new)."""
    rng = random.Random(seed)
    for i in range(10**9):
        yield (f"What do we know about {rng.choice(NAMES)} and the {rng.choice(THINGS)} in "
               f"{rng.choice(PLACES)}? ({i})")  # fmt: skip


def percentiles(seconds: list[float]) -> tuple[float, float]:
    ordered = sorted(seconds)
    return statistics.median(ordered) * 1e3, ordered[int(0.9 * (len(ordered) - 1))] * 1e3


async def timed_async(call: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole process) of one awaited call."""
    started, cpu = time.perf_counter(), time.process_time()
    await call()
    return time.perf_counter() - started, time.process_time() - cpu


def timed(call: Callable[[], Any]) -> tuple[float, float]:
    started, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - started, time.process_time() - cpu


async def overhead(
    label: str, calls: int, adapter: Callable[[], Awaitable[Any]], core: Callable[[], Any]
) -> None:
    """Adapter and core calls in pairs, the pair's order alternating (ABBA: neither side
    always runs second, on warmer caches). The overhead is the median of the pairs'
    differences over the core's median: paired, it is less at the mercy of the machine's
    load drifting during the run than a ratio of two medians. Beside the wall time (what the
    caller waits), the process's CPU time (every thread's): the work the adapter adds,
    without the wait for a core that a woken worker thread has on a loaded machine."""
    mine: list[tuple[float, float]] = []
    theirs: list[tuple[float, float]] = []
    for i in range(calls):
        if i % 2:
            theirs.append(timed(core))
            mine.append(await timed_async(adapter))
        else:
            mine.append(await timed_async(adapter))
            theirs.append(timed(core))
    cells = []
    for side in (0, 1):  # wall, then CPU
        ours, core_ = [m[side] for m in mine], [t[side] for t in theirs]
        (a50, _), (c50, _) = percentiles(ours), percentiles(core_)
        extra = statistics.median(a - c for a, c in zip(ours, core_)) * 1e3
        share = f"{extra / c50:+8.1%}" if c50 >= 0.01 else f"{extra:+6.3f}ms"  # a no-op
        cells.append(f"{a50:8.3f} {c50:8.3f} {share}")
    print(f"  {label:<44} {cells[0]}   {cells[1]}")


async def run(args: argparse.Namespace) -> None:
    from autogen_core.memory import ListMemory, MemoryContent, MemoryMimeType
    from autogen_core.model_context import UnboundedChatCompletionContext
    from autogen_core.models import UserMessage
    from llama_index.core.llms import ChatMessage

    from fastmem.integrations.autogen import FastmemMemory
    from fastmem.integrations.llamaindex import FastmemMemoryBlock

    texts = facts(args.memories)
    asked = questions(11)
    counter = TokenCounter("cl100k_base")
    root = tempfile.mkdtemp(prefix="fastmem-bench-")
    store = fastmem.open(root, namespace="bench")
    store.wait_preload(30)
    ids = store.add_many([{"text": t, "type": "fact"} for t in texts])
    assert len(ids) == len(texts)
    memory = FastmemMemory(store, k=5)
    block = FastmemMemoryBlock(store=store)
    calls = args.calls
    print(f"{len(store)} memories; {calls} calls per row; p50 ms; overhead: median of the "
          f"pairs' differences / core p50")  # fmt: skip
    print(f"  {'':<44} {'wall time':^26}   {'CPU time (all threads)':^26}")
    print(f"  {'adapter call / core call':<44} {'adapter':>8} {'core':>8} {'overhead':>8}   "
          f"{'adapter':>8} {'core':>8} {'overhead':>8}")  # fmt: skip

    def new_context() -> Any:
        return UnboundedChatCompletionContext([UserMessage(content=next(asked), source="user")])

    # Every argument is made before the timing starts: building a MemoryContent or a model
    # context is the caller's work, not the adapter's.
    extra = iter(facts(8 * calls + 8, seed=99))
    contents = iter([MemoryContent(content=next(extra), mime_type=MemoryMimeType.TEXT)
                     for _ in range(calls)])  # fmt: skip
    contexts = iter([new_context() for _ in range(calls)])
    asks = iter([[ChatMessage(role="user", content=next(asked))] for _ in range(calls)])
    turns = iter([[ChatMessage(role="user", content=next(extra)),
                   ChatMessage(role="assistant", content=next(extra))] for _ in range(calls)])
    texts_ = [next(extra) for _ in range(3 * calls)]
    plain, pairs = iter(texts_[:calls]), iter(zip(texts_[calls::2], texts_[calls + 1::2]))

    TEXT_PLAIN = {"mime_type": "text/plain"}
    await overhead("a bare thread hop (asyncio.to_thread) / no-op", calls,
                   lambda: asyncio.to_thread(int), int)
    await overhead("autogen add / MemoryStore.add", calls,
                   lambda: memory.add(next(contents)),
                   lambda: store.add(next(plain), type="fact", metadata=TEXT_PLAIN))
    await overhead("autogen query / MemoryStore.search (k=5)", calls,
                   lambda: memory.query(next(asked)), lambda: store.search(next(asked), 5))
    await overhead("autogen update_context / MemoryStore.context", calls,
                   lambda: memory.update_context(next(contexts)),
                   lambda: store.context(next(asked), 1300))
    await overhead("llamaindex aget / MemoryStore.context", calls,
                   lambda: block.aget(next(asks)), lambda: store.context(next(asked), 1300))
    await overhead("llamaindex aput (2 messages) / add_many", calls,
                   lambda: block.aput(next(turns)),
                   lambda: store.add_many([
                       {"text": f"{role}: {t}", "metadata": {"role": role}, "session": None,
                        "type": "conversation"}
                       for role, t in zip(("user", "assistant"), next(pairs))]))
    # The peers' rows below hold exactly the original facts: forget what the rows above added.
    originals = set(ids)
    for memory_id in [m.id for m in store if m.id not in originals]:
        store.forget(memory_id)

    if args.no_peers:
        store.close()
        return
    peers: dict[str, Any] = {"FastmemMemory": memory}
    # Chroma's update_context adds its k=5 results; fastmem's, a context of `budget` tokens:
    # this row gives fastmem about the same volume as Chroma's five facts.
    small = FastmemMemory(store, k=5, budget=100)
    peers["FastmemMemory (budget=100)"] = small
    # Chroma's query is a vector search alone; fastmem's default is hybrid (vector, keywords,
    # neighbours, and a second embedding of a question that names someone, without the name).
    peers["FastmemMemory (mode=vector)"] = VectorQueries(small)
    listed = ListMemory()
    for text in texts:
        await listed.add(MemoryContent(content=text, mime_type=MemoryMimeType.TEXT))
    peers["ListMemory"] = listed
    chroma = await chroma_memory(texts, root)
    if chroma is not None:
        peers["ChromaDBVectorMemory (k=5)"] = chroma

    print(f"\nAutoGen's memories, {len(texts)} facts each; wall ms (p50, p90), CPU ms of all "
          f"threads (p50), tokens update_context adds (p50)")  # fmt: skip
    print(f"  {'memory':<30} {'query':>8} {'p90':>7} {'cpu':>6}   {'update':>8} {'p90':>7} "
          f"{'cpu':>6} {'tokens':>7}")  # fmt: skip
    rows = {}
    for name, peer in peers.items():
        query = [await timed_async(lambda p=peer: p.query(next(asked))) for _ in range(calls)]
        update, tokens = [], []
        for _ in range(calls):
            context = new_context()
            update.append(await timed_async(lambda p=peer, c=context: p.update_context(c)))
            added = (await context.get_messages())[1:]
            tokens.append(sum(counter.count(str(m.content)) for m in added))
        (q50, q90), (u50, u90) = percentiles([q[0] for q in query]), percentiles(
            [u[0] for u in update])
        qcpu, ucpu = percentiles([q[1] for q in query])[0], percentiles([u[1] for u in update])[0]
        rows[name] = (q50, u50, qcpu, ucpu)
        print(f"  {name:<30} {q50:8.3f} {q90:7.2f} {qcpu:6.2f}   {u50:8.3f} {u90:7.2f} "
              f"{ucpu:6.2f} {statistics.median(tokens):7.0f}")  # fmt: skip
    base = rows["FastmemMemory"]
    for name, (q50, u50, qcpu, ucpu) in rows.items():
        if not name.startswith("FastmemMemory"):
            print(f"  {name} / FastmemMemory (p50): query {q50 / base[0]:.2f}x wall, "
                  f"{qcpu / base[2]:.2f}x CPU; update_context {u50 / base[1]:.2f}x wall, "
                  f"{ucpu / base[3]:.2f}x CPU")  # fmt: skip
    if chroma is not None:
        await chroma.close()
    store.close()


class VectorQueries:
    """A FastmemMemory whose queries are vector searches (``query(..., mode="vector")``)."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory

    async def query(self, text: str) -> Any:
        return await self.memory.query(text, mode="vector")

    async def update_context(self, context: Any) -> Any:
        return await self.memory.update_context(context)


async def chroma_memory(texts: list[str], root: str) -> Any:
    try:
        import chromadb  # noqa: F401
        from autogen_core.memory import MemoryContent, MemoryMimeType
        from autogen_ext.memory.chromadb import (
            ChromaDBVectorMemory,
            CustomEmbeddingFunctionConfig,
            PersistentChromaDBVectorMemoryConfig,
        )
    except ImportError:
        print("(chromadb is not installed: pip install 'fastmem[bench]' for its row)")
        return None
    config = PersistentChromaDBVectorMemoryConfig(
        collection_name="bench", persistence_path=f"{root}/chroma", k=5,
        embedding_function_config=CustomEmbeddingFunctionConfig(function=fastmem_embedding),
    )  # fmt: skip
    memory = ChromaDBVectorMemory(config=config)
    for text in texts:
        await memory.add(MemoryContent(content=text, mime_type=MemoryMimeType.TEXT))
    return memory


def fastmem_embedding() -> Any:
    """A Chroma embedding function on fastmem's own model (offline, same vectors)."""
    from chromadb.api.types import Documents, EmbeddingFunction, Embeddings

    class FastmemEmbedding(EmbeddingFunction[Documents]):
        def __init__(self) -> None:
            self.model = fastmem.embed.default_embedder()

        def __call__(self, input: Documents) -> Embeddings:
            return list(self.model.encode(list(input)))

        @staticmethod
        def name() -> str:
            return "fastmem-minilm-int8"

    return FastmemEmbedding()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memories", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--no-peers", action="store_true", help="the adapter overhead rows only")
    args = parser.parse_args()
    print(f"fastmem {fastmem.__version__} ({fastmem.BACKEND} kernels), Python "
          f"{platform.python_version()}, {platform.machine()}, {platform.system()}")  # fmt: skip
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
