"""A real Ray cluster on this machine for the tests and benchmarks: a head and worker
nodes, each a `ray start --block` process in its own process group on its own loopback
address (127.0.0.2, .3, ...; Ray replaces 127.0.0.1 by the host's address), each with its
own `fastmem-node` label. Nodes are killed, stopped and restarted by their process group
id, never by name (`ray stop` would stop every Ray on the machine)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
# Fast failure detection: a node that stops answering is declared dead after ~4 s, not ~30 s.
HEALTH = {"RAY_health_check_initial_delay_ms": "1000", "RAY_health_check_period_ms": "1000",
          "RAY_health_check_timeout_ms": "1000", "RAY_health_check_failure_threshold": "3"}  # fmt: skip


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Node:
    def __init__(self, cluster: LocalCluster, label: str, ip: str, head: bool) -> None:
        self.label, self.ip, self.head = label, ip, head
        self.log = os.path.join(cluster.dir, f"node-{label}.log")
        args = [RAY, "start", "--block", f"--node-ip-address={ip}", "--num-cpus=1",
                f"--labels=fastmem-node={label}", f"--resources={{\"fastmem-{label}\": 1}}",
                f"--temp-dir={cluster.dir}", "--object-store-memory=78643200",
                "--disable-usage-stats", "--include-log-monitor=false"]  # fmt: skip
        if head:
            args += ["--head", f"--port={cluster.port}", "--include-dashboard=false"]
        else:
            args += [f"--address={cluster.address}"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=cluster.env,
                                         start_new_session=True)  # fmt: skip
        self.pgid = self.proc.pid  # its own session: the raylet and its workers are in it

    def wait_started(self, timeout: float = 90.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if "Ray runtime started" in Path(self.log).read_text(errors="replace"):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"ray node {self.label} did not start: {Path(self.log).read_text()[-2000:]}")

    def pids(self) -> list[int]:
        """Every process of the node: `ray start`'s process group and their descendants
        (Ray's workers, actors included, run in process groups of their own)."""
        parents: dict[int, int] = {}
        groups: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                    parents[int(entry)], groups[int(entry)] = int(fields[1]), int(fields[2])
        found = {pid for pid, group in groups.items() if group == self.pgid}
        grew = True
        while grew:
            more = {pid for pid, parent in parents.items() if parent in found} - found
            found |= more
            grew = bool(more)
        return sorted(found)

    def signal(self, sig: int) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def kill(self) -> None:
        """The node dies at once: every process of it, SIGKILL."""
        for _ in range(3):  # a process may fork while we walk /proc
            self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def stop(self) -> None:
        pids = self.pids()
        self.signal(signal.SIGCONT)  # a stopped node cannot act on SIGTERM
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        for pid in pids + self.pids():  # whatever outlived `ray start`
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


class LocalCluster:
    def __init__(self, workers: int = 3, host_prefix: str = "127.0.0") -> None:
        self.dir = tempfile.mkdtemp(prefix="fmray", dir="/tmp")  # short: Ray's socket paths
        self.head_ip = f"{host_prefix}.2"
        self.port = free_port(self.head_ip)
        self.address = f"{self.head_ip}:{self.port}"
        # No token: the nodes listen on loopback only. (Ray reads a driver's token once per
        # process, so a token made here would not reach a driver that imported Ray before.)
        self.auth = {"RAY_AUTH_MODE": "disabled"}
        self.env = {**os.environ, **HEALTH, **self.auth, "RAY_USAGE_STATS_ENABLED": "0", "FASTMEM_EMBEDDER": "none",
                    "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                                   os.environ.get("PYTHONPATH", "")])}  # fmt: skip
        self.nodes: dict[str, Node] = {}
        try:
            self.head = self._add("head", self.head_ip, head=True)
            self.head.wait_started()
            for i in range(workers):
                self.add_worker(f"w{i + 1}", f"{host_prefix}.{i + 3}")
        except BaseException:
            self.stop()
            raise

    def _add(self, label: str, ip: str, head: bool = False) -> Node:
        node = Node(self, label, ip, head)
        self.nodes[label] = node
        return node

    def add_worker(self, label: str, ip: str | None = None) -> Node:
        ip = ip or self.nodes[label].ip
        node = self._add(label, ip)
        node.wait_started()
        return node

    def stop(self) -> None:
        for node in reversed(list(self.nodes.values())):
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def moto_s3(host: str = "127.0.0.6"):
    """moto's S3 server on a loopback address, with a bucket ``cold``; stopped by its pid.
    Yields the fsspec URL and storage options of ``s3://cold/fleet``."""
    import boto3
    import botocore.exceptions

    server = Path(sys.executable).with_name("moto_server")
    port = free_port(host)
    proc = subprocess.Popen([str(server), "-H", host, "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    endpoint = f"http://{host}:{port}"
    try:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test",
                              aws_secret_access_key="test", region_name="us-east-1")  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create_bucket(Bucket="cold")
                break
            except botocore.exceptions.EndpointConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        client.close()
        yield {"url": "s3://cold/fleet", "options": {
            "key": "test", "secret": "test", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}}
    finally:
        proc.terminate()
        proc.wait(10)
