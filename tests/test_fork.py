"""Fork and abandoned handles (issue 18, item 6).

A process that forks while fastmem loads something in a background thread (the tiktoken
encoding, the embedding model, the level-2 preload, the group commit's fdatasync) gives
its child copies of locks held by threads the child does not have, and of loads that will
never finish there. One at-fork registry (``fastmem._threads.at_fork``) resets them; each
test below forks inside one such window, in a fresh process (the windows happen once per
process), and the child's first ``add`` must complete (a hang fails at the timeout).

A store dropped without ``close()`` releases its descriptors and its writer lock when it
is garbage-collected, reference cycles or not, and says so with a ``ResourceWarning``.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import fastmem

QUIET = fastmem.ContextPolicy(preload=0, recent=0)
FASTMEM_ROOT = os.path.dirname(os.path.dirname(fastmem.__file__))
CHILD_TIMEOUT = 30  # seconds: a child that hangs on its first add fails the test

# Forks while the window's thread sleeps inside it (a wrapper signals, then sleeps 0.5 s,
# then runs the real step), then the child opens the store anew and adds one memory with
# the default embedder (its vector is computed, so the model must load in the child).
FORKER = textwrap.dedent("""
    import os, sys, threading, time, traceback
    import fastmem
    from fastmem import embed, tokens
    from fastmem.storage import engine as _engine, fileio as _io

    window, path = sys.argv[1], sys.argv[2]
    entered = threading.Event()
    if window == "preload":  # memories to preload (the other windows must be the first loads)
        with fastmem.open(path, policy=fastmem.ContextPolicy(preload=0, recent=0)) as seed:
            seed.add_many([{"text": f"seed {i}", "importance": 0.9} for i in range(5)])

    def slow(fn):
        def wrapper(*args, **kwargs):
            if not entered.is_set():
                entered.set()
                time.sleep(0.5)  # the parent forks meanwhile
            return fn(*args, **kwargs)
        return wrapper

    if window == "tokenizer":  # tiktoken's encoding (made from the ranks file, or by tiktoken)
        import tiktoken
        tiktoken.Encoding.__init__ = slow(tiktoken.Encoding.__init__)
    elif window == "counter":  # the compiled counter's table, read before the encoding
        tokens.cl100k_ranks_file = slow(tokens.cl100k_ranks_file)
    elif window == "model":
        embed.MiniLM._load_model = slow(embed.MiniLM._load_model)
    elif window == "preload":
        _engine.Engine.cached_memory = slow(_engine.Engine.cached_memory)
    elif window == "commit":
        class SlowOs:
            def __getattr__(self, name):
                return getattr(os, name)
            fdatasync = staticmethod(slow(os.fdatasync))
        _io.os = SlowOs()

    policy = fastmem.ContextPolicy(preload=10, recent=5)
    store = fastmem.open(path, policy=policy)  # starts the loads
    if window == "tokenizer":  # loaded when first needed: by a count of a code point that the
        # compiled counter's Unicode table does not assign (U+0378), which it hands to tiktoken
        threading.Thread(target=store.tokens.count, args=("caf\u0378",), daemon=True).start()
    if window in ("preload", "commit"):
        store.add("in the parent")
    assert entered.wait(20), "the window was never entered"
    pid = os.fork()
    if pid == 0:
        try:
            with fastmem.open(path, policy=policy) as child:
                assert child.tokens.count("caf\u0378 au lait") == 6  # tiktoken, in the child
                mid = child.add("added by the child")
                assert child.get(mid).text == "added by the child"
                assert child.search("added by the child", 1)[0].id == mid
            os._exit(0)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
    deadline = time.monotonic() + float(sys.argv[3])
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            print("the child hung on its first add", flush=True)
            os._exit(2)
        time.sleep(0.05)
    store.close()
    code = os.waitstatus_to_exitcode(status)
    print("child exit", code, flush=True)
    os._exit(0 if code == 0 else 3)
""")


@pytest.fixture(autouse=True)
def backend():
    """Forking is the same under both kernel backends: one run."""
    yield fastmem.BACKEND


@pytest.mark.parametrize("window", ["counter", "tokenizer", "model", "preload", "commit"])
def test_a_child_forked_inside_a_load_window_adds(tmp_path, window):
    env = dict(os.environ)
    env.pop("FASTMEM_EMBEDDER", None)  # the default model: its load is one of the windows
    env["PYTHONPATH"] = os.pathsep.join([FASTMEM_ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run([sys.executable, "-c", FORKER, window, str(tmp_path / "store"), str(CHILD_TIMEOUT)],
                          env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT + 60)  # fmt: skip
    assert done.returncode == 0, f"{window}: {done.stdout}\n{done.stderr}"
    with fastmem.open(str(tmp_path / "store"), embedder=None, readonly=True) as store:
        assert "added by the child" in [m.text for m in store]


# --- abandoned handles ---------------------------------------------------------------------


def _fds() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


@pytest.mark.parametrize("cycle", [False, True], ids=["plain", "in-a-cycle"])
def test_a_store_dropped_without_close_lets_go_and_warns(store_path, cycle):
    fds = _fds()
    # No preload: its thread holds the store for a moment now and then, and a collection
    # then would find it still referenced (it is collected later, warning elsewhere).
    store = fastmem.open(store_path, embedder=None, durability="always", policy=QUIET)
    store.add("kept")
    if cycle:
        store.me = store  # type: ignore[attr-defined]  # only the cycle collector frees it
    with pytest.warns(ResourceWarning, match="was not closed"):
        del store
        gc.collect()
    assert not {f for f in _fds() - fds if f.startswith(os.path.dirname(store_path))}
    # The writer lock went with the descriptors: another handle writes at once.
    with fastmem.open(store_path, embedder=None, timeout=0) as again:
        again.add("after")
        assert [m.text for m in again] == ["kept", "after"]


def test_a_handle_whose_failed_write_could_not_be_cut_lets_go_when_collected(store_path):
    """The handle keeps the writer lock after a failed write it could not cut off (no other
    process may append after those bytes); collected without close(), it cuts them and lets
    go, as close() does."""
    import errno

    from faults import Faults

    store = fastmem.open(store_path, embedder=None, durability="always", policy=QUIET)
    store.add("acknowledged")
    with Faults(fail_at=1, errno_=errno.ENOSPC, only=("write", "ftruncate"), short=True, sticky=True):
        with pytest.raises(fastmem.DurabilityError):
            store.add_many([{"text": f"unacknowledged {i}"} for i in range(50)])
    with pytest.raises(fastmem.StoreLockedError):  # even opening takes the lock a moment
        fastmem.open(store_path, embedder=None, timeout=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del store
        gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fastmem.RecoveryWarning)
        with fastmem.open(store_path, embedder=None, timeout=0) as again:
            again.add("after")
            assert [m.text for m in again] == ["acknowledged", "after"]
            assert again.verify().ok


def test_a_closed_store_whose_sync_failed_is_freed(store_path):
    """The engine kept the DurabilityError it raised, whose traceback holds the frames of
    the failed add, and so the store: with the engine held by the store's finalizer, the
    store could never be freed (nor the index's maps in those frames: `fastmem import`
    in the fault sweep left two descriptors of a deleted index open)."""
    import errno
    import weakref

    from faults import Faults

    store = fastmem.open(store_path, embedder=None, durability="always", policy=QUIET)
    store.add("acknowledged")
    with Faults(fail_at=1, errno_=errno.EIO, only=("fdatasync",)), pytest.raises(fastmem.DurabilityError):
        store.add("its sync fails")
    with pytest.raises(fastmem.DurabilityError):
        store.close()
    gone = weakref.ref(store)
    del store
    gc.collect()
    assert gone() is None
