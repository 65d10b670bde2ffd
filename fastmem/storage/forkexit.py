"""A child made by ``fork()`` after onnxruntime was imported exits without running the C++
static destructors it inherited.

onnxruntime starts a thread when it is imported (a timed wait on a condition variable; seen
from 1.30 to 1.32). A forked child has a copy of that condition variable, with its waiter
count, but not the thread: at the child's ``exit()`` onnxruntime's static destructors
destroy the condition variable, which waits for that waiter forever (glibc's
``pthread_cond_destroy``), or join the thread, which throws (``std::system_error``: the
child aborts). A pre-forking server (import, open, fork workers) saw its workers hang at
exit, or die of SIGABRT.

So in such a child, once Python has finalized (every Python ``atexit`` handler has run and
Python's own files are flushed), the C library's exit handlers that were registered before
the fork are skipped: an ``on_exit`` handler registered at fork time, which runs before
them (the handlers run last registered first), ends the process with ``_exit(status)``,
the status ``exit()`` was given. It is glibc's ``on_exit`` calling ``_exit`` itself (no
Python code runs after finalization). What is skipped: onnxruntime's destructors and other
native libraries' exit handlers from before the fork, and the flush of C ``stdio`` buffers
(Python's ``print`` does not use them). Elsewhere (no ``on_exit``: musl, macOS) nothing is
done.
"""

from __future__ import annotations

import sys

from .._threads import at_fork

__all__: list[str] = []


@at_fork
def _after_fork_in_child() -> None:
    if "onnxruntime" not in sys.modules:
        return  # nothing of it to skip; a later import in the child is the child's own
    import ctypes  # (here: its import costs a fresh process's ``import fastmem`` ~1 ms)

    try:
        libc = ctypes.CDLL(None)
        on_exit, exit_now = libc.on_exit, libc._exit
    except (OSError, AttributeError):
        return
    on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    on_exit.restype = ctypes.c_int
    # on_exit calls its handler as handler(status, arg): _exit(status), the second
    # argument ignored (the C calling conventions fastmem runs on pass it in a register).
    on_exit(ctypes.cast(exit_now, ctypes.c_void_p), None)
