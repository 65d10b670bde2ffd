"""fastmem._threads.Beside: a job run by the process's helper thread while the caller works."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from fastmem._threads import Beside

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
