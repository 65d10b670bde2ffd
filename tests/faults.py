"""Fault injection for fastmem's file operations: make the n-th call fail with an errno.

One seam: the modules that do file I/O (``_engine``, ``_state``, ``_io``, ``_files``, ``_index``,
``_erase``, ``_maintenance``, ``_checkpoint``) reach the OS through their module globals ``os``
and ``mmap``; while a :class:`Faults` is installed those names are proxies that count every call of
``os.write``/``pwrite``, ``os.fdatasync``, ``os.fsync`` (a directory's counts as
``fsync_dir``), ``os.ftruncate``, ``os.replace``/``rename``, ``os.open``, ``mmap.mmap``
and the writes through ``os.fdopen`` (the index file), and make the chosen call raise
``OSError(errno)`` instead of running. The compiled kernels (``fastmem._kernels._ext``) do no file
I/O of their own (they read and frame bytes in buffers the Python layer hands them), so
nothing is missed below this seam; reads (``pread``, ``fstat``) are not faulted.

    with Faults(fail_at=3, errno_=errno.EIO) as faults:
        store.add("x")          # the 3rd counted call raises EIO
    faults.calls               # [("write", path-or-fd), ("fdatasync", ...), ...]
"""

from __future__ import annotations

import errno as _errno
import mmap as _real_mmap
import os as _real_os
import stat
import threading
from typing import Any

import importlib

# Every fastmem module that calls a file operation (tests/test_faults.py checks the list).
NAMES = ("storage.engine", "storage.handle_state", "storage.fileio", "storage.recovery", "storage.index",
         "storage.maintenance", "storage.erase", "storage.checkpoint")
MODULES = tuple(importlib.import_module(f"fastmem.{name}") for name in NAMES)
ERRNOS = (_errno.ENOSPC, _errno.EIO, _errno.EDQUOT)


class Faults:
    """Count the file operations made while installed; fail call number ``fail_at`` (1-based;
    0 never) with ``errno_``. ``only`` restricts both the counting and the failing to some
    kinds (``"write"``, ``"fdatasync"``...). ``sticky``: every call from ``fail_at`` on fails
    (a device that stays full or broken), not only that one. ``short``: when call
    ``fail_at`` is an ``os.write``, it first writes half of its bytes and returns that
    (as a filling disk does), and the call after it fails instead."""

    def __init__(self, fail_at: int = 0, errno_: int = _errno.EIO, *, only: tuple[str, ...] | None = None,
                 sticky: bool = False, short: bool = False, also: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.fail_at, self.errno, self.only, self.sticky = fail_at, errno_, only, sticky
        # More modules to reach (the Hermes writer's spill files: "fastmem.integrations._writer").
        self.modules = MODULES + tuple(importlib.import_module(name) for name in also)
        self.short = short
        self.errnos: dict[str, int] = {}  # another errno for some kinds
        self.calls: list[tuple[str, str]] = []
        self.fired: tuple[str, str] | None = None
        self._mutex = threading.Lock()
        self._saved: list[tuple[Any, Any, Any]] = []

    # --- the seam ------------------------------------------------------------------------

    def tick(self, kind: str, what: Any) -> str | None:
        """Called before each faultable operation: count it, and raise if it is the one
        (``"short"``: the caller writes half and returns)."""
        if self.only is not None and kind not in self.only:
            return None
        with self._mutex:
            self.calls.append((kind, str(what)))
            short_write = isinstance(what, int) and kind == "write"
            n = len(self.calls)
            fail = self.fail_at and (n == self.fail_at or (self.sticky and n > self.fail_at))
            if fail and self.short and short_write:
                self.short, self.fail_at = False, n + 1
                return "short"
            if fail and self.fired is None:
                self.fired = (kind, str(what))
        if fail:
            code = self.errnos.get(kind, self.errno)
            raise OSError(code, _real_os.strerror(code))

    def install(self) -> Faults:
        return install(self, self.modules, {"os": _OsProxy(self), "mmap": _MmapModuleProxy(self)})

    def uninstall(self) -> None:
        uninstall(self)

    def __enter__(self) -> Faults:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


def install(owner: Any, modules: tuple[Any, ...], proxies: dict[str, Any]) -> Any:
    """Put ``proxies`` (module global name -> object) in place in each of ``modules`` that
    has that global, keeping what was there in ``owner._saved``; returns ``owner``."""
    for module in modules:
        for name, proxy in proxies.items():
            if hasattr(module, name):
                owner._saved.append((module, name, getattr(module, name)))
                setattr(module, name, proxy)
    return owner


def uninstall(owner: Any) -> None:
    for module, name, value in reversed(owner._saved):
        setattr(module, name, value)
    owner._saved.clear()


class _OsProxy:
    """``os`` with the faultable calls counted first."""

    def __init__(self, faults: Faults) -> None:
        self._f = faults

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_os, name)

    def write(self, fd: int, data: Any) -> int:
        if self._f.tick("write", fd) == "short":
            return _real_os.write(fd, bytes(memoryview(data)[: max(1, len(data) // 2)]))
        return _real_os.write(fd, data)

    def pwrite(self, fd: int, data: Any, offset: int) -> int:
        self._f.tick("write", fd)
        return _real_os.pwrite(fd, data, offset)

    def fdatasync(self, fd: int) -> None:
        self._f.tick("fdatasync", fd)
        _real_os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        kind = "fsync_dir" if stat.S_ISDIR(_real_os.fstat(fd).st_mode) else "fsync"
        self._f.tick(kind, fd)
        _real_os.fsync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        self._f.tick("ftruncate", fd)
        _real_os.ftruncate(fd, length)

    def replace(self, src: Any, dst: Any) -> None:
        self._f.tick("replace", dst)
        _real_os.replace(src, dst)

    def rename(self, src: Any, dst: Any) -> None:
        self._f.tick("replace", dst)
        _real_os.rename(src, dst)

    def open(self, path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        self._f.tick("open", path)
        return _real_os.open(path, flags, mode, **kw)

    def fdopen(self, fd: int, *args: Any, **kw: Any) -> Any:
        return _File(_real_os.fdopen(fd, *args, **kw), self._f)


class _File:
    """A file object whose ``write`` is a faultable write (the index is written so)."""

    def __init__(self, f: Any, faults: Faults) -> None:
        self._file, self._f = f, faults

    def write(self, data: Any) -> int:
        self._f.tick("write", self._file.name)
        return self._file.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def __iter__(self) -> Any:  # reading lines (the Hermes writer's spill files)
        return iter(self._file)

    def __enter__(self) -> _File:
        self._file.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.__exit__(*exc)


class _MmapMeta(type):
    faults: Faults

    def __call__(cls, *args: Any, **kw: Any) -> Any:
        cls.faults.tick("mmap", args[0] if args else "")
        return _real_mmap.mmap(*args, **kw)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _real_mmap.mmap)


class _MmapModuleProxy:
    """``mmap`` whose ``mmap(...)`` is counted (and real maps still pass ``isinstance``)."""

    def __init__(self, faults: Faults) -> None:
        self.mmap = _MmapMeta("mmap", (), {"faults": faults})

    def __getattr__(self, name: str) -> Any:
        return getattr(_real_mmap, name)
