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


def open_fs(url: str, options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec file system of ``url`` and the path under it (no trailing ``/``)."""
    try:
        import fsspec  # type: ignore[import-untyped]
    except ImportError as exc:
        raise RayUnavailableError(f"object storage needs fsspec ({exc}): pip install 'fastmem[ray]'") from None
    fs, base = fsspec.core.url_to_fs(url, **dict(options or {}))
    return fs, base.rstrip("/")


def upload(fs: Any, files: Mapping[str, str], prefix: str) -> dict[str, dict[str, Any]]:
    """Upload local files (name -> path) under ``prefix``; returns each one's size and
    SHA-256 for the manifest, which the caller writes after it (the commit point)."""
    done = {}
    fs.makedirs(prefix, exist_ok=True)  # a local directory needs it; object stores have no directories
    for name, local in files.items():
        digest, size = _sha256(local)
        fs.put_file(local, f"{prefix}/{name}")
        done[name] = {"sha256": digest, "size": size}
    return done


def download_checked(fs: Any, prefix: str, files: Mapping[str, Mapping[str, Any]], directory: str,
                     what: str, error: type[Exception] = ColdChecksumError) -> list[tuple[str, str]]:  # fmt: skip
    """Download a manifest's ``files`` from under ``prefix`` to temporary names in
    ``directory`` and check each size and SHA-256; returns ``(temporary, final)`` pairs for
    the caller to rename into place. On any failure the temporary files are removed and
    nothing in ``directory`` changed; a mismatch raises ``error`` naming ``what``."""
    pairs: list[tuple[str, str]] = []
    try:
        for name, want in files.items():
            tmp = os.path.join(directory, f".{name}.download")
            pairs.append((tmp, os.path.join(directory, name)))
            fs.get_file(f"{prefix}/{name}", tmp)
            digest, size = _sha256(tmp)
            if digest != want["sha256"] or size != want["size"]:
                raise error(
                    f"{name} of {what} has sha256 {digest[:16]}..., its manifest says "
                    f"{want['sha256'][:16]}...: the copy is damaged; nothing was replaced"
                )
    except BaseException:
        for tmp, _ in pairs:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    return pairs


class ColdTier:
    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        self.fs, self.base = open_fs(url, options)

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
        present = {n: os.path.join(directory, n) for n in FILES if os.path.exists(os.path.join(directory, n))}
        files = upload(self.fs, present, self._key(namespace, generation))
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
        try:
            tmps = download_checked(self.fs, self._key(namespace, manifest["generation"]), manifest["files"],
                                    directory, f"store {namespace!r} (frozen generation {manifest['generation']})")
        except BaseException:
            self.release(namespace, owner)
            raise
        for tmp, final in tmps:
            os.replace(tmp, final)
        return {"generation": manifest["generation"], "bytes": sum(f["size"] for f in manifest["files"].values())}
