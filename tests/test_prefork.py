"""A pre-forking server's pattern: import fastmem, open the store (the default embedder loads
onnxruntime), fork workers; each writes and exits. onnxruntime starts a thread of its own
when it is imported, and its static destructors, run by a child's ``exit()``, wait for that
thread's condition variable (it has no such thread): the child hung at exit, or aborted
("terminate called ... std::system_error"). Each worker must exit with its own status."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fastmem

pytest.importorskip("onnxruntime")

SERVER = textwrap.dedent(
    """
    import os, sys, time
    import fastmem

    path, workers = sys.argv[1], int(sys.argv[2])
    store = fastmem.open(path)
    store.add("from the server")  # waits for the model: onnxruntime is imported and has run
    store.close()
    pids = []
    for i in range(workers):
        pid = os.fork()
        if pid == 0:
            with fastmem.open(path) as worker:
                worker.add(f"from worker {i}")
            sys.exit(3 if i == 0 else 0)  # the status must come through
        pids.append(pid)
    deadline = time.monotonic() + 120  # a guard against a hang, not a speed bound
    for pid in pids:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                print(pid, os.waitstatus_to_exitcode(status), flush=True)
                break
            if time.monotonic() > deadline:
                print(pid, "hangs", flush=True)
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                break
            time.sleep(0.05)
    with fastmem.open(path, readonly=True) as store:
        print("memories", len(store), flush=True)
    """
)


@pytest.fixture(autouse=True)
def backend() -> str:
    """One run: the processes use the default kernels."""
    return fastmem.BACKEND


def test_forked_workers_write_and_exit_after_onnxruntime_loaded(tmp_path: Path) -> None:
    env = dict(os.environ, FASTMEM_EMBEDDER="default")
    done = subprocess.run(
        [sys.executable, "-c", SERVER, str(tmp_path / "agent"), "3"],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    lines = done.stdout.split("\n")
    statuses = [line.split()[1] for line in lines if line and not line.startswith("memories")]
    assert statuses == ["3", "0", "0"], (done.stdout, done.stderr[-2000:])
    assert "memories 4" in done.stdout, done.stdout
    assert "terminate called" not in done.stderr, done.stderr[-2000:]
