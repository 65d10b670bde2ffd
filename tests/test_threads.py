"""fastmem._threads: the delayed start of background threads (the compiled ``start_later``,
a thread that waits without the GIL, against its Python reference, in the process, in a
forked child and at interpreter exit), and ``Beside``, a job run by the process's helper
thread while the caller works."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from fastmem import _threads
from fastmem._threads import Beside

ext = pytest.importorskip("fastmem._kernels._ext.starter")
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
from fastmem._kernels._ext import starter
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


WAIT = 10.0  # seconds: a job that never runs fails here instead of hanging the suite


def test_the_helper_runs_the_job_and_result_returns_its_value():
    ran = threading.Event()
    where: list[int] = []

    def job(a, b):
        where.append(threading.get_ident())
        ran.set()
        return a + b

    beside = Beside(job, 2, 3)
    assert ran.wait(WAIT)  # run without the caller asking
    assert beside.result() == 5
    assert where != [threading.get_ident()]


def test_result_raises_the_jobs_exception():
    def job():
        raise KeyError("counted wrong")

    beside = Beside(job)
    with pytest.raises(KeyError, match="counted wrong"):
        beside.result()


def test_a_job_the_helper_has_not_started_runs_in_the_caller():
    release, started = threading.Event(), threading.Event()

    def busy():
        started.set()
        return release.wait(WAIT)

    first = Beside(busy)
    assert started.wait(WAIT)  # the helper is inside the first job
    second = Beside(threading.get_ident)
    assert second.result() == threading.get_ident()  # did not wait behind the first
    release.set()
    assert first.result() is True


def test_result_hands_the_value_over_and_keeps_no_reference():
    import weakref

    class Made:
        pass

    beside = Beside(Made)
    value = beside.result()
    made = weakref.ref(value)
    del value  # the job itself is still held here, as the helper thread may hold it
    assert made() is None and beside is not None


def test_cancel_waits_for_a_job_under_way_and_drops_what_it_made():
    import weakref

    started, made = threading.Event(), []

    class Made:
        pass

    def job():
        started.set()
        time.sleep(0.2)
        value = Made()
        made.append(weakref.ref(value))
        return value

    beside = Beside(job)
    assert started.wait(WAIT)
    beside.cancel()
    assert made and made[0]() is None  # ended, and its value no longer held


def test_cancel_of_a_job_not_started_never_runs_it():
    release, started, ran = threading.Event(), threading.Event(), []

    def busy():
        started.set()
        return release.wait(WAIT)

    first = Beside(busy)
    assert started.wait(WAIT)
    second = Beside(ran.append, 1)  # queued behind the first
    second.cancel()
    release.set()
    assert first.result() is True
    assert ran == []


def test_a_forked_child_gets_a_helper_of_its_own():
    script = textwrap.dedent("""
        import os, sys
        from fastmem._threads import Beside
        assert Beside(lambda: 1).result() == 1  # the parent's helper thread exists
        pid = os.fork()
        if pid == 0:
            import threading
            ran = threading.Event()
            job = Beside(lambda: ran.set() or 7)
            ok = ran.wait(10) and job.result() == 7
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=60, check=False)
    assert done.returncode == 0


def test_a_forked_child_tells_the_parents_threads_from_its_own():
    """A fork is counted (``forks()``; no getpid on the open path): in the child, a
    Background asked for in the parent is not run (its thread is the parent's) and
    ``join()`` returns at once; one asked for in the child runs there; the parent's release
    queue is not the child's."""
    script = textwrap.dedent("""
        import os, sys, threading
        from fastmem.storage import recovery as _files
        from fastmem import _threads
        ran = []
        parents = _threads.Background(lambda: ran.append("parent's"), "test")  # not started yet
        queue = _files.releaser()
        before = _threads.forks()
        pid = os.fork()
        if pid == 0:
            done = threading.Event()
            _threads.Background(done.set, "test")
            ok = (_threads.forks() == before + 1 and parents.join(0) and ran == []
                  and done.wait(10) and _files.releaser() is not queue)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert parents.join(10) and ran == ["parent's"] and _threads.forks() == before
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, timeout=60, check=False)
    assert done.returncode == 0


def test_a_discarded_job_never_runs():
    release, started = threading.Event(), threading.Event()
    ran: list[str] = []

    def busy():
        started.set()
        release.wait(WAIT)

    first = Beside(busy)
    assert started.wait(WAIT)
    second = Beside(ran.append, "second")
    second.discard()
    release.set()
    first.result()
    third = Beside(ran.append, "third")  # queued after the second: the helper has passed it
    third.result()
    assert ran == ["third"]


def test_wait_returns_whether_the_job_ended():
    release = threading.Event()
    beside = Beside(release.wait, WAIT)
    assert beside.wait(0.01) is False  # still running (or not started)
    release.set()
    assert beside.wait(WAIT) is True
    assert beside.result() is True


# --- Flag: threading.Event's set / is_set / wait, of one lock --------------------------


@pytest.mark.parametrize("kind", [_threads.Flag, threading.Event])
def test_a_flag_answers_as_an_event(kind):
    """Each step is checked on both: Event is the reference."""
    flag = kind()
    assert not flag.is_set()
    assert flag.wait(0) is False and flag.wait(-1.0) is False and flag.wait(0.01) is False
    flag.set()
    assert flag.is_set() and flag.wait() is True and flag.wait(0) is True and flag.wait(-1) is True
    flag.set()  # again: nothing changes, nothing raises
    assert flag.is_set() and flag.wait(0.01) is True


def test_a_flag_wakes_every_waiter_and_times_out_unset():
    flag = _threads.Flag()
    woke: list[bool] = []
    waiters = [threading.Thread(target=lambda: woke.append(flag.wait(60))) for _ in range(8)]
    for t in waiters:
        t.start()
    late = threading.Thread(target=lambda: woke.append(flag.wait(0.02)))  # gives up first
    late.start()
    late.join()
    assert woke == [False]
    flag.set()
    for t in waiters:
        t.join(60)
    assert woke == [False] + [True] * 8 and flag.wait(0) is True


def _race_setters_and_waiters(flag: _threads.Flag) -> list[BaseException]:
    errors: list[BaseException] = []

    def setter() -> None:
        try:
            flag.set()
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    def waiter() -> None:
        try:
            flag.wait(60)
            flag.wait(60)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=f) for f in (setter, waiter) * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_a_flag_set_by_many_threads_at_once_is_set_once():
    """Setters racing each other: the lock is released once (a second release would raise
    in a setter, or release a waiter's hold and raise in that waiter)."""
    for _ in range(50):
        flag = _threads.Flag()
        assert _race_setters_and_waiters(flag) == []
        assert flag.is_set() and flag._lock.acquire(False)  # free: released once
