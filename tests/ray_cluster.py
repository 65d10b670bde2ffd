"""A real Ray cluster on this machine for the tests and benchmarks: a head and worker
nodes, each started by its own `ray start` in a process group of its own on its own
loopback address (127.0.0.2, .3, ...; Ray replaces 127.0.0.1 by the host's address), each
with its own `fastmem-node` label. Nodes are killed, stopped and restarted by their own
processes' pids, never by name (`ray stop` would stop every Ray on the machine).

Light on purpose (``benchmarks/ray_footprint.py`` measures it): `ray start` returns once
its node is up instead of staying (`--block` kept a ~110 MB Python process per node), the
head runs no autoscaler monitor (`--no-monitor`: a fixed cluster), no dashboard and no log
monitor, and each node has one CPU and a 75 MB object store. As `ray start` has exited, its
process group id may be a stranger's once the node's processes are gone: see Node.pids."""

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
import uuid
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
# Fast failure detection: a node that stops answering is declared dead after ~4 s, not ~30 s.
HEALTH = {"RAY_health_check_initial_delay_ms": "1000", "RAY_health_check_period_ms": "1000",
          "RAY_health_check_timeout_ms": "1000", "RAY_health_check_failure_threshold": "3"}  # fmt: skip
# No idle worker started ahead of time (~80 MB each): shards are actors, each in a worker
# of its own, started when it is created.
LEAN = {"RAY_prestart_worker_first_driver": "0", "RAY_enable_worker_prestart": "0"}


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Node:
    def __init__(self, cluster: LocalCluster, label: str, ip: str, head: bool) -> None:
        self.label, self.ip, self.head = label, ip, head
        self.log = os.path.join(cluster.dir, f"node-{label}.log")
        args = [RAY, "start", f"--node-ip-address={ip}", "--num-cpus=1",
                f"--labels=fastmem-node={label}", f"--resources={{\"fastmem-{label}\": 1}}",
                f"--temp-dir={cluster.dir}", "--object-store-memory=78643200",
                "--disable-usage-stats", "--include-log-monitor=false"]  # fmt: skip
        if head:
            args += ["--head", f"--port={cluster.port}", "--include-dashboard=false", "--no-monitor"]
        else:
            args += [f"--address={cluster.address}"]
        # In the environment of the node's processes (they inherit it): how pids() knows them.
        self.marker = f"FASTMEM_TEST_NODE={cluster.dir}:{label}:{uuid.uuid4().hex[:8]}".encode()
        env = {**cluster.env, "FASTMEM_TEST_NODE": self.marker.decode().partition("=")[2]}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)  # fmt: skip
        self.pgid = self.proc.pid  # its own session: the raylet and its agents are in it

    def wait_started(self, timeout: float = 90.0) -> None:
        """Until `ray start` says the node is up (it exits a moment later: not waited for)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if "Ray runtime started" in Path(self.log).read_text(errors="replace"):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"ray node {self.label} did not start: {Path(self.log).read_text()[-2000:]}")

    def pids(self) -> list[int]:
        """Every process of the node: those of `ray start`'s process group (the raylet,
        its agents, the head's GCS), those that carry the node's marker in their
        environment, and all their descendants (Ray's workers, actors included, run in
        process groups of their own)."""
        parents: dict[int, int] = {}
        groups: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                    parents[int(entry)], groups[int(entry)] = int(fields[1]), int(fields[2])
        found = {pid for pid in parents if self._marked(pid)}
        # `ray start` has exited: a live process with its pid is a stranger that got the
        # number once the group was empty, and the group is then the stranger's.
        if self.proc.poll() is None or self.pgid not in parents or self.pgid in found:
            found |= {pid for pid, group in groups.items() if group == self.pgid}
        grew = True
        while grew:
            more = {pid for pid, parent in parents.items() if parent in found} - found
            found |= more
            grew = bool(more)
        return sorted(found)

    def _marked(self, pid: int) -> bool:
        """Whether ``pid`` carries the node's marker (a process that rewrote its title over
        its environment, as Ray's agents do, may not show it: the group finds those)."""
        try:
            return self.marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False

    def signal(self, sig: int) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def kill(self) -> None:
        """The node dies at once: every process of it, SIGKILL."""
        for _ in range(3):  # a process may fork while we walk /proc
            self.signal(signal.SIGKILL)
        self.gone(10)

    def gone(self, timeout: float) -> bool:
        """Wait until no process of the node is left (killed ones reaped by their parents)."""
        end = time.monotonic() + timeout
        while self.pids():
            if time.monotonic() > end:
                return False
            time.sleep(0.1)
        return True


class LocalCluster:
    def __init__(self, workers: int = 3, host_prefix: str = "127.0.0") -> None:
        self.dir = tempfile.mkdtemp(prefix="fmray", dir="/tmp")  # short: Ray's socket paths
        self.head_ip = f"{host_prefix}.2"
        self.port = free_port(self.head_ip)
        self.address = f"{self.head_ip}:{self.port}"
        # No token: the nodes listen on loopback only. (Ray reads a driver's token once per
        # process, so a token made here would not reach a driver that imported Ray before.)
        self.auth = {"RAY_AUTH_MODE": "disabled"}
        self.env = {**os.environ, **HEALTH, **LEAN, **self.auth, "RAY_USAGE_STATS_ENABLED": "0", "FASTMEM_EMBEDDER": "none",
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

    @contextlib.contextmanager
    def client_proxy(self):
        """Ray Client's proxy for this cluster, started only for the tests that use it (it
        and the server it starts per client take ~160 MB); what `ray start --head
        --ray-client-server-port` runs. Yields its ``ray://`` address; stopped by its pid."""
        port = free_port(self.head_ip)
        env = {**self.env, "FASTMEM_TEST_NODE": self.head.marker.decode().partition("=")[2]}  # the head's
        log = open(os.path.join(self.dir, "client-proxy.log"), "ab")  # noqa: SIM115 - the process's
        proc = subprocess.Popen([sys.executable, "-m", "ray.util.client.server", f"--host={self.head_ip}",
                                 f"--port={port}", "--mode=proxy", f"--address={self.address}"],
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip
        try:
            end = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection((self.head_ip, port), timeout=1).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > end:
                        raise RuntimeError(f"Ray Client's proxy did not start (exit {proc.poll()})") from None
                    time.sleep(0.2)
            yield f"ray://{self.head_ip}:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()

    def stop(self) -> None:
        """Every node at once: SIGTERM, 5 s to go, then SIGKILL for what is left."""
        nodes = list(self.nodes.values())
        for node in nodes:
            node.signal(signal.SIGCONT)  # a stopped node cannot act on SIGTERM
            node.signal(signal.SIGTERM)
        end = time.monotonic() + 5
        for node in nodes:
            node.gone(max(0.0, end - time.monotonic()))
        for node in nodes:
            node.kill()
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
