"""Background threads that do not hold up the call that started them, and the one at-fork
registry (:func:`at_fork`) that resets fastmem's process-wide state in a forked child."""

from __future__ import annotations

import _thread
import os
import queue  # at import, not at open(): a store's first open starts the helper thread
import threading
import time
from collections.abc import Callable
from typing import Any


# How long a background thread waits before it starts. Importing an extension (``dlopen``)
# and the Rust parsers of ``tokenizers`` and ``tiktoken`` hold the GIL for tens of
# milliseconds without a switch; a loader that started at once stalled the ``open()`` that
# started it (measured at 1 M memories: 6 to 60 ms with the default embedder, 1.8 ms
# without). ``open()`` takes about a millisecond, so a short wait lets it return first.
START_DELAY = 0.02  # seconds


class Flag:
    """``threading.Event``'s ``set``, ``is_set`` and ``wait``, made of one lock (never
    cleared). An Event builds a Condition, ~5 µs each in a fresh process, and ``open()``
    made seven of them (its loaders' done flags, the model's and the preload's).

    The lock is held from the start and released by the one ``set()``; a waiter takes it
    and gives it back at once, so every waiter wakes.
    """

    __slots__ = ("_armed", "_lock", "_set")

    def __init__(self) -> None:
        self._set = False
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._armed = [self._lock]  # popped by the first set(): list.pop is atomic

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        try:
            lock = self._armed.pop()
        except IndexError:  # set already
            return
        self._set = True
        lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for ``set()``, at most ``timeout`` seconds (``None``: no limit); whether
        it was set."""
        if self._set:
            return True
        wait = -1.0 if timeout is None else min(max(timeout, 0.0), threading.TIMEOUT_MAX)
        if self._lock.acquire(True, wait):
            self._lock.release()
        return self._set


class Background:
    """``target`` run once in a daemon thread of its own, started ``START_DELAY`` after it
    is asked for; the caller does not wait.

    ``threading.Thread.start`` returns only after the new thread has run and handed the
    GIL back (two wake-ups across cores, 0.2 to 1 ms each on a 2-core VM), and creating a
    thread costs 60 to 90 µs more. ``open()`` asks for up to three loaders (tiktoken, the
    preload, the embedding model): the first request of a call schedules one starter
    (``start_later``: a thread that waits without the GIL, see src_cython/starter.pyx),
    which starts them all after the delay; the caller only queues them. A fresh process's
    open + 20 newest at 10 k: 1.37 ms with Thread.start, 1.01 ms with a Python starter
    thread; at 100 k, ~0.04 ms less again with the compiled starter (default embedder).
    Whoever needs the result first runs ``target``: a ``join()`` before the thread has
    started runs it in the caller (a store closed at once does not wait out the delay).
    """

    def __init__(self, target: Callable[[], object], name: str) -> None:
        self.name = name  # for a debugger: such a thread has no threading.Thread object
        self._target = target
        self._ident: int | None = None
        self._done = Flag()
        self._claim = threading.Lock()  # held by whichever runs target: starter or joiner
        self._forks = _forks
        _schedule(self)

    def _run(self) -> None:
        self._ident = _thread.get_ident()
        try:
            self._target()
        finally:
            self._done.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for ``target`` to return (or run it here, if its thread has not started);
        False on timeout. In a forked child, where the thread does not exist (as
        ``threading`` treats its threads there), at once."""
        if _forks != self._forks:
            return True
        if self._claim.acquire(blocking=False):
            self._run()
            return True
        return self._done.wait(timeout)

    def is_current(self) -> bool:
        """Whether the caller is this thread."""
        return self._ident == _thread.get_ident()

    def hurry(self) -> None:
        """Start ``target`` now, in a thread of its own, if nothing has begun it yet: for a
        caller about to wait for it (a context that needs the model), who would otherwise
        wait out ``START_DELAY`` too. The delay is for the call that asked for the thread,
        which has returned by then."""
        if _forks == self._forks and self._claim.acquire(blocking=False):
            _thread.start_new_thread(self._run, ())


class Beside:
    """``fn(*args)`` run by this process's helper thread while the caller goes on with other
    work; :meth:`result` waits for it and returns its value or raises its exception.

    For compiled work that lets the GIL go (a batch's token counting): on two cores it runs
    beside the caller's own work instead of before it. One helper thread per process, made
    by the first request and kept (a thread made per call costs 60 to 90 µs and its start
    two wake-ups). A job the helper has not started yet when :meth:`result` is called
    (the helper busy with another caller's job, or gone in a forked child) runs in the
    caller instead, so no caller waits behind another's job or on a thread that is gone.
    """

    __slots__ = ("_args", "_claim", "_done", "_error", "_fn", "_value")

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._fn, self._args = fn, args
        self._claim = threading.Lock()  # held by whichever runs fn: the helper or result()
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        _helper().put(self)

    def _run(self) -> None:
        try:
            self._value = self._fn(*self._args)
        except BaseException as exc:  # noqa: BLE001 - handed to result()'s caller
            self._error = exc
        finally:
            self._fn = self._args = None  # type: ignore[assignment]
            self._done.set()

    def wait(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the job to end (run, or discarded);
        whether it has."""
        return self._done.wait(timeout)

    def discard(self) -> None:
        """The result is not wanted: a job not started yet never runs (one running
        finishes, unwaited for)."""
        if self._claim.acquire(blocking=False):
            self._fn = self._args = None  # type: ignore[assignment]
            self._done.set()

    def cancel(self) -> None:
        """:meth:`discard`, then wait for a job under way to end and drop what it made: once
        this returns, nothing of the job runs on or is held (the helper thread may still
        hold the job itself for a moment)."""
        self.discard()
        self._done.wait()
        self._value = self._error = None

    def result(self) -> Any:
        """``fn``'s return value (run here if the helper has not started it); raises what
        ``fn`` raised."""
        if self._claim.acquire(blocking=False):
            self._run()
        else:
            self._done.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        # Handed over, not kept: the helper thread may hold this job a moment longer, and a
        # value may be large or hold a mapped file (a checkpoint's postings)
        value, self._value = self._value, None
        return value


def _helper_loop(todo: queue.SimpleQueue[Beside]) -> None:
    while True:
        job = todo.get()
        if job._claim.acquire(blocking=False):  # not run by its caller meanwhile
            job._run()
        del job  # its value belongs to the caller now


_helper_queue: queue.SimpleQueue[Beside] | None = None
_starter_lock = threading.Lock()
_todo: list[Background] = []  # asked for, not yet started
_scheduled = False  # whether a start of _todo is under way (not in a forked child: below)
# Which process this is, as fork() counts them: 0 in the one that imported fastmem, one more
# in each child that fork() makes (the hook below runs before any other code there). What
# state made before a fork is told from the child's own by, instead of os.getpid(): a
# process's first getpid costs ~9 µs, and a fresh process's restart made six (issue 21).
_forks = 0


def forks() -> int:
    """How many forks lie between this process and the one that imported fastmem."""
    return _forks


# --- fork -------------------------------------------------------------------------------
# A child made by fork() has one thread, the one that forked; every other thread of the
# parent is gone, yet the child's memory holds the parent's locks as they were (held, if a
# thread held them), its loads as they were (never to finish there), and the state of any
# library a thread was inside (a half-run import, tiktoken's registry lock). So:
# - work that must not be cut in half by a fork (the loads of the encoding and the model)
#   runs under a ForkGate, which a fork waits for (up to FORK_WAIT seconds);
# - each module with process-wide state (loaders, background threads, locks, caches
#   holding locks) registers a reset with at_fork; they run in the child, in the order
#   registered, before fork() returns there.
FORK_WAIT = 10.0  # seconds a fork waits for a load under way (they take ~0.1-0.5 s)
_fork_hooks: list[tuple[Callable[[], None] | None, Callable[[], None] | None, Callable[[], None] | None]] = []


def at_fork(
    child: Callable[[], None] | None = None, *, before: Callable[[], None] | None = None,
    parent: Callable[[], None] | None = None,
) -> Any:  # fmt: skip
    """Run ``child()`` in every child made by ``fork()`` (before ``fork()`` returns there;
    it must replace state, never wait for a thread); ``before()`` in the forking thread
    before the fork, ``parent()`` in the parent after it. Usable as a decorator."""
    _fork_hooks.append((before, parent, child))
    return child


class ForkGate:
    """A lock that ``fork()`` waits for: what runs under it is never cut in half by a fork
    (a child never inherits a half-loaded encoding or model, a half-run import, or a lock
    some library took inside). Re-entrant. Waits at most FORK_WAIT, then forks anyway."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._held = False
        at_fork(self._reset, before=self._before, parent=self._after_in_parent)

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def _before(self) -> None:
        self._held = self._lock.acquire(timeout=FORK_WAIT)

    def _after_in_parent(self) -> None:
        if self._held:
            self._held = False
            self._lock.release()

    def _reset(self) -> None:
        self._lock, self._held = threading.RLock(), False


def _before_fork() -> None:
    for before, _, _ in reversed(_fork_hooks):
        if before is not None:
            before()


def _after_fork_in_parent() -> None:
    for _, parent, _ in _fork_hooks:
        if parent is not None:
            parent()


def _after_fork_in_child() -> None:
    global _starter_lock, _todo, _scheduled, _helper_queue, _forks
    _forks += 1
    _starter_lock, _todo, _scheduled = threading.Lock(), [], False  # the parent's start is not here
    _helper_queue = None  # nor its helper thread
    _reset_starter()
    for _, _, child in _fork_hooks:
        if child is not None:
            child()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)  # fmt: skip


def _schedule(thread: Background) -> None:
    """Queue ``thread``; the first of a call's requests schedules their start."""
    global _scheduled
    with _starter_lock:
        _todo.append(thread)
        if _scheduled:
            return
        _scheduled = True
    try:
        _start_later(START_DELAY, _start_queued)
    except BaseException:  # no thread (a resource limit): the next request tries again
        with _starter_lock:
            _scheduled = False
        raise


def _helper() -> queue.SimpleQueue[Beside]:
    """This process's queue of jobs for its helper thread (made by the first)."""
    global _helper_queue
    with _starter_lock:
        if _helper_queue is None:  # none yet (a fork's hook drops the parent's: below)
            todo: queue.SimpleQueue[Beside] = queue.SimpleQueue()
            _thread.start_new_thread(_helper_loop, (todo,))
            _helper_queue = todo
        return _helper_queue


def _start_queued() -> None:
    """Start what was asked for meanwhile (what one call asked for starts together)."""
    global _todo, _scheduled
    with _starter_lock:
        batch, _todo, _scheduled = _todo, [], False
    for thread in batch:
        if thread._claim.acquire(blocking=False):  # not run by a join() meanwhile
            _thread.start_new_thread(thread._run, ())


def _start_later_py(delay: float, target: Callable[[], object]) -> None:
    """``target()`` in a new thread ``delay`` seconds from now (the reference of the compiled
    ``start_later``, whose thread holds no GIL while it waits: see src_cython/starter.pyx)."""

    def wait_then_run() -> None:
        time.sleep(delay)
        target()

    _thread.start_new_thread(wait_then_run, ())


def use_starter(backend: str) -> None:
    """Start background threads with the compiled ``start_later`` (``"cython"``, when it
    was built) or the Python one (``"python"``): ``FASTMEM_BACKEND`` chooses at import."""
    global _start_later, _reset_starter
    _start_later, _reset_starter = _start_later_py, _no_reset
    if backend != "python":
        try:
            from ._kernels._ext.starter import after_fork_in_child, start_later
        except ImportError:
            if backend == "cython":
                raise
        else:  # its reset in a forked child, taken now: a fork hook should not import
            _start_later, _reset_starter = start_later, after_fork_in_child


def _no_reset() -> None:
    pass


_start_later: Callable[[float, Callable[[], object]], None] = _start_later_py
_reset_starter: Callable[[], None] = _no_reset
use_starter(os.environ.get("FASTMEM_BACKEND", "auto"))
