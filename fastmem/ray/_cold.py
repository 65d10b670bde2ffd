"""The cold tier: idle stores frozen to object storage through fsspec, thawed on first use.

Layout under the tier's URL, per store: ``<slot>/<namespace>/manifest.json`` (the frozen
generation: each file's size and SHA-256), ``<slot>/<namespace>/<generation>/<file>`` (the
store's two files and the shard's operation log) and, while a node has it thawed,
``<slot>/<namespace>/owner``. The owner object is created with a *conditional create*
(``If-None-Match: *`` on S3; ``O_EXCL`` on a file system): of two nodes thawing one store
at once exactly one succeeds, and the other gets ``StoreOwnedElsewhereError`` until the
owner freezes it back. A thaw downloads to temporary names, checks every SHA-256, and
only then renames the files into place; a freeze uploads a new generation, then writes the
manifest (the commit point), then removes the local files and the owner object.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

from ..namespaces import make_private_dirs
from ._config import slot_dir, slot_of
from ._errors import ColdChecksumError, RayUnavailableError, StoreOwnedElsewhereError

FILES = ("memory.dat", "memory.idx", "ray-ops.jsonl")
CHUNK = 1 << 20


def _sha256(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


class ColdTier:
    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        try:
            import fsspec  # type: ignore[import-untyped]
        except ImportError as exc:
            raise RayUnavailableError(f"the cold tier needs fsspec ({exc}): pip install 'fastmem[ray]'") from None
        self.fs, self.base = fsspec.core.url_to_fs(url, **dict(options or {}))
        self.base = self.base.rstrip("/")

    def _key(self, namespace: str, *parts: str) -> str:
        return "/".join((self.base, slot_dir(slot_of(namespace)), namespace, *parts))

    def manifest(self, namespace: str) -> dict[str, Any] | None:
        try:
            return json.loads(self.fs.cat_file(self._key(namespace, "manifest.json")))
        except FileNotFoundError:
            return None

    def owner(self, namespace: str) -> str | None:
        try:
            return self.fs.cat_file(self._key(namespace, "owner")).decode()
        except FileNotFoundError:
            return None

    def claim(self, namespace: str, owner: str) -> None:
        """Own ``namespace`` (conditional create); already ours is fine.

        Raises:
            StoreOwnedElsewhereError: another owner holds it.
        """
        key = self._key(namespace, "owner")
        try:
            if hasattr(self.fs, "makedirs"):
                self.fs.makedirs(self._key(namespace), exist_ok=True)
            with self.fs.open(key, "xb") as f:
                f.write(owner.encode())
            return
        except FileExistsError:
            pass
        holder = self.owner(namespace)
        if holder != owner:
            raise StoreOwnedElsewhereError(
                f"store {namespace!r} is owned by {holder!r} in the cold tier: freeze it there "
                f"first (this node is {owner!r})"
            )

    def release(self, namespace: str, owner: str) -> None:
        if self.owner(namespace) == owner:
            self.fs.rm_file(self._key(namespace, "owner"))

    def frozen(self, namespace: str) -> bool:
        return self.manifest(namespace) is not None and self.owner(namespace) is None

    def namespaces(self, slot: int) -> list[str]:
        try:
            entries = self.fs.ls(f"{self.base}/{slot_dir(slot)}", detail=False)
        except FileNotFoundError:
            return []
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)

    def freeze(self, namespace: str, directory: str, owner: str) -> dict[str, Any]:
        """Upload the closed store in ``directory`` as a new generation, commit it with
        the manifest, then remove the local files and give up ownership."""
        self.claim(namespace, owner)
        old = self.manifest(namespace)
        generation = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        files = {}
        for name in FILES:
            local = os.path.join(directory, name)
            if not os.path.exists(local):
                continue
            digest, size = _sha256(local)
            self.fs.put_file(local, self._key(namespace, generation, name))
            files[name] = {"sha256": digest, "size": size}
        manifest = {"namespace": namespace, "generation": generation, "files": files,
                    "frozen_at": time.time(), "frozen_by": owner}  # fmt: skip
        self.fs.pipe_file(self._key(namespace, "manifest.json"), json.dumps(manifest).encode())
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
        self.release(namespace, owner)
        if old is not None and old.get("generation") != generation:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self._key(namespace, old["generation"]), recursive=True)
        return {"generation": generation, "bytes": sum(f["size"] for f in files.values())}

    def thaw(self, namespace: str, directory: str, owner: str) -> dict[str, Any]:
        """Own the store, download its frozen files and check them; only then put them
        in place in ``directory``.

        Raises:
            StoreOwnedElsewhereError: another node owns it.
            ColdChecksumError: a file does not match its manifest (nothing is replaced; the
                claim is given back).
        """
        manifest = self.manifest(namespace)
        if manifest is None:
            raise FileNotFoundError(f"store {namespace!r} is not in the cold tier")
        self.claim(namespace, owner)
        make_private_dirs(directory)
        tmps = []
        try:
            for name, want in manifest["files"].items():
                tmp = os.path.join(directory, f".{name}.thaw")
                tmps.append((tmp, os.path.join(directory, name)))
                self.fs.get_file(self._key(namespace, manifest["generation"], name), tmp)
                digest, size = _sha256(tmp)
                if digest != want["sha256"] or size != want["size"]:
                    raise ColdChecksumError(
                        f"{name} of store {namespace!r} (generation {manifest['generation']}) "
                        f"has sha256 {digest[:16]}..., its manifest says {want['sha256'][:16]}...: "
                        f"the frozen copy is damaged; nothing was replaced"
                    )
        except BaseException:
            for tmp, _ in tmps:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            self.release(namespace, owner)
            raise
        for tmp, final in tmps:
            os.replace(tmp, final)
        return {"generation": manifest["generation"], "bytes": sum(f["size"] for f in manifest["files"].values())}
