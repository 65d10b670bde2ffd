"""Backups of stores to object storage (for node-local stores): taken while the store
serves, restored onto the node that now owns a lost node's stores.

Layout under the destination URL: ``<namespace>/<generation>/memory.dat``, ``memory.idx``
and ``manifest.json`` (each file's size and SHA-256), the manifest uploaded last: it is the
commit point, and a generation without one (an upload that died) is never restored.
Generations are named by the backup's UTC time (``20261204T163000.123456Z-1a2b3c``), so they sort
oldest to newest. Uploading and checking reuse the cold tier's code (``_cold``).

A job given ``keep=N`` prunes each store's backups after its own upload: the complete
generations past the newest N go (manifest first, so a prune cut short leaves a generation
that is incomplete, never one restored half-deleted), and so do unfinished ones older than
the oldest kept and a day old (an upload that died; a younger one may still be uploading).
"""

from __future__ import annotations

import calendar
import json
import os
import tempfile
import time
import uuid
from collections.abc import Mapping
from typing import Any

import fastmem

from ..namespaces import make_private_dirs
from ._cold import download_checked, open_fs, upload
from ._errors import BackupChecksumError, RestoreRefusedError

MANIFEST = "manifest.json"
STORE_FILES = ("memory.dat", "memory.idx")
ABANDONED_AFTER = 86_400.0  # seconds after which an unfinished upload is taken for dead


class Backups:
    """The backups under one fsspec URL (``s3://bucket/prefix``, ``file:///...``)."""

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        if not isinstance(url, str) or not url:
            raise fastmem.InvalidInputError("backups need a destination URL (dest=, --dest)")
        self.url = url
        self.fs, self.base = open_fs(url, options)

    def _key(self, *parts: str) -> str:
        return "/".join((self.base, *parts))

    def put(self, store: Any, namespace: str, scratch: str) -> dict[str, Any]:
        """Copy the open ``store`` (it goes on serving) to a temporary directory under
        ``scratch``, upload it as a new generation and commit it with its manifest."""
        now = time.time()  # to the microsecond: two backups in one second still sort in order
        generation = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}.{int(now * 1e6) % 1000000:06d}Z-{uuid.uuid4().hex[:6]}"
        make_private_dirs(scratch)
        with tempfile.TemporaryDirectory(prefix=".backup-", dir=scratch) as tmp:
            report = store.backup(os.path.join(tmp, "memory"))
            files = upload(self.fs, {n: os.path.join(tmp, n) for n in STORE_FILES}, self._key(namespace, generation))
        manifest = {"namespace": namespace, "generation": generation, "files": files,
                    "memories": report.memories, "backed_up_at": time.time()}  # fmt: skip
        self.fs.pipe_file(self._key(namespace, generation, MANIFEST), json.dumps(manifest).encode())
        return {"generation": generation, "memories": report.memories,
                "bytes": sum(f["size"] for f in files.values()), "url": f"{self.url.rstrip('/')}/{namespace}/{generation}"}  # fmt: skip

    def namespaces(self) -> list[str]:
        """Every namespace with at least one backup (complete or not)."""
        try:
            entries = self.fs.ls(self.base, detail=False)
        except FileNotFoundError:
            return []
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in entries)

    def generations(self, namespace: str) -> list[str]:
        """``namespace``'s complete backups (manifest present), newest first."""
        found = self.fs.glob(self._key(namespace, "*", MANIFEST))
        return sorted((p.rstrip("/").split("/")[-2] for p in found), reverse=True)

    def prune(self, namespace: str, keep: int, now: float | None = None) -> list[str]:
        """Delete ``namespace``'s complete backups past the newest ``keep`` and its dead
        unfinished uploads (see the module's docstring); returns the generations deleted."""
        complete = self.generations(namespace)
        if len(complete) <= keep:
            return []
        oldest_kept = complete[keep - 1]
        now = time.time() if now is None else now
        found = self.fs.glob(self._key(namespace, "*"))
        every = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in found)
        dead = [g for g in every if g not in complete and g < oldest_kept
                and now - _started(g) > ABANDONED_AFTER]  # fmt: skip
        for generation in complete[keep:]:
            self.fs.rm_file(self._key(namespace, generation, MANIFEST))
        for generation in complete[keep:] + dead:
            self.fs.rm(self._key(namespace, generation), recursive=True)
        return sorted(complete[keep:] + dead)

    def restore(self, namespace: str, directory: str, generation: str | None = None) -> dict[str, Any]:
        """Download ``generation`` (default: the newest complete one), check every file
        against its manifest, and only then put the files in place in ``directory``.

        Raises:
            RestoreRefusedError: ``directory`` already holds the store's files.
            fastmem.StoreNotFoundError: no complete backup of ``namespace`` (or no such generation).
            BackupChecksumError: a file does not match its manifest; nothing was installed.
        """
        if any(os.path.exists(os.path.join(directory, n)) for n in STORE_FILES):
            raise RestoreRefusedError(f"{directory} already holds store {namespace!r}: a restore never "
                                      f"replaces a store; move its files away first")  # fmt: skip
        complete = self.generations(namespace)
        generation = generation or (complete[0] if complete else None)
        if generation is None or generation not in complete:
            named = f" named {generation!r} (complete ones: {complete})" if generation else ""
            raise fastmem.StoreNotFoundError(f"no complete backup of {namespace!r} under {self.url}{named}")
        manifest = json.loads(self.fs.cat_file(self._key(namespace, generation, MANIFEST)))
        make_private_dirs(directory)
        try:
            pairs = download_checked(self.fs, self._key(namespace, generation), manifest["files"], directory,
                                     f"backup {generation} of {namespace!r}", BackupChecksumError)  # fmt: skip
        except BackupChecksumError as exc:
            older = [g for g in complete if g < generation][:3]
            hint = f" (older complete backups, for generation=: {older})" if older else ""
            raise BackupChecksumError(f"{exc}{hint}") from None
        for tmp, final in pairs:
            os.replace(tmp, final)
        return {"generation": generation, "memories": manifest.get("memories"),
                "bytes": sum(f["size"] for f in manifest["files"].values())}  # fmt: skip


def _started(generation: str) -> float:
    """When the backup named ``generation`` started (0 for a name that is not a backup's)."""
    try:
        return float(calendar.timegm(time.strptime(generation[:15], "%Y%m%dT%H%M%S")))
    except ValueError:
        return 0.0
