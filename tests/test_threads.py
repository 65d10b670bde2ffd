"""The delayed start of background threads (``fastmem._threads``): the compiled
``start_later`` (a thread that waits without the GIL) against its Python reference, in
the process, in a forked child and at interpreter exit."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from fastmem import _threads

ext = pytest.importorskip("fastmem._ext.starter")
STARTERS = {"cython": ext.start_later, "python": _threads._start_later_py}


@pytest.fixture(autouse=True)
def backend():
    """Each test here runs both starters itself: run it once."""
    return "both"


@pytest.mark.parametrize("name", STARTERS)
def test_start_later_runs_the_target_once_in_another_thread_after_the_delay(name):
    start_later = STARTERS[name]
    ran, done = [], threading.Event()

    def target():
        ran.append((time.monotonic(), threading.get_ident()))
        done.set()

    t0 = time.monotonic()
    start_later(0.05, target)
    assert time.monotonic() - t0 < 0.05 and not ran  # returned at once, target not run yet
    assert done.wait(30)
    time.sleep(0.05)
    assert len(ran) == 1
    at, ident = ran[0]
    assert at - t0 >= 0.049 and ident != threading.get_ident()


@pytest.mark.parametrize("name", STARTERS)
def test_start_later_reports_what_the_target_raises(name, monkeypatch):
    reported, done = [], threading.Event()

    def hook(unraisable):
        reported.append(unraisable.exc_value)
        done.set()

    monkeypatch.setattr(sys, "unraisablehook", hook)

    def fails():
        raise RuntimeError("escaped")

    STARTERS[name](0, fails)
    assert done.wait(30) and str(reported[0]) == "escaped"


def test_start_later_checks_its_arguments():
    with pytest.raises(TypeError):
        ext.start_later(0.01, "not callable")
    for delay in (-1.0, float("nan")):
        with pytest.raises(ValueError):
            ext.start_later(delay, lambda: None)


EXITING = """
import sys, time
from fastmem._ext import starter
seen = []
for i in range(40):  # threads waking before, while and after the interpreter finalizes
    starter.start_later(0.0002 * i, lambda: (seen.append(1), time.sleep(0.002)))
time.sleep(float(sys.argv[1]))
"""


@pytest.mark.parametrize("pause", [0.0, 0.001, 0.003, 0.006])
def test_a_process_exits_cleanly_while_its_threads_wake(pause):
    # Threads that wake while the interpreter finalizes. The exit hook keeps them from
    # taking the GIL once finalizing has begun (CPython does not promise what that does);
    # this checks the exits are clean, with or without the hook: 3.11 survived 60 runs of
    # 300 threads waking across the exit without it, so it cannot show the hook is needed.
    for _ in range(10):
        done = subprocess.run([sys.executable, "-c", EXITING, str(pause)],
                              check=False, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0 and done.stderr == "", done.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_starts_its_own_threads_and_exits():
    ran = threading.Event()
    ext.start_later(0.2, ran.set)  # still waiting when the child is made
    pid = os.fork()
    if pid == 0:  # the parent's waiting thread is not here; this process's own ones run
        child_ran = threading.Event()
        ext.start_later(0.0, child_ran.set)
        os._exit(0 if child_ran.wait(10) and not ran.is_set() else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert ran.wait(30)


def test_background_uses_the_starter_chosen(monkeypatch):
    for name, start_later in STARTERS.items():
        _threads.use_starter(name)
        assert _threads._start_later is start_later
        done = threading.Event()
        thread = _threads.Background(done.set, "test")
        assert done.wait(30) and thread.join(30)
    _threads.use_starter(os.environ.get("FASTMEM_BACKEND", "auto"))
