"""SIGKILL crash harness: a writer under ``durability="always"`` killed at random moments.

A fork server (``python tests/crash_harness.py serve``) imports fastmem, numpy and the
token encoding once; each round it forks a writer that opens the store (recovering from
the last kill), runs a random mix of adds, batches, updates, forgets, evictions,
checkpoints and compactions, and appends one line per step to an acknowledgement file
(one ``write()`` per line: a kill never leaves half a line that parses). The harness kills
it with SIGKILL after a random delay, then checks the store in its own process:

- it opens; ``verify()`` is clean;
- every acknowledged memory is there, byte for byte (text, metadata, session, type),
  unless a forget or an eviction of it was acknowledged (then it must be gone) or in
  flight (then either);
- nothing garbled: every memory returned carries its own checksum and is one that was
  acknowledged or in flight.

With several writers (:func:`run_rounds`): each round forks ``writers`` writer processes
and a compaction loop on one store, all at once; they are killed one by one, in a random
order, each at a random moment of its own progress (the others go on writing meanwhile:
a kill lands while others wait for the writer lock, or follow a compaction). After each
round the same checks hold, across all the writers' acknowledgements, and no memory is
there twice. Each writer touches only its own memories (``metadata["w"]``), and keeps the
store small with forgets instead of evictions (an eviction picks anyone's memories).

Used by ``tests/test_crash.py`` (200+ kills; several writers: 60) and
``benchmarks/crash_soak.py`` (5,000+).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PHASES = ("open", "add", "add_many", "update", "forget", "evict", "checkpoint", "compact")


def _text(seed: int, i: int, rng: random.Random) -> str:
    """A memory's text, carrying a checksum of itself: garbling shows without a model."""
    body = f"seed {seed} item {i} " + "ü✓日本 lorem ipsum "[: rng.randint(0, 19)] * rng.randint(0, 60)
    return f"{body} #{hashlib.sha256(body.encode()).hexdigest()[:16]}"


def self_checked(text: str) -> bool:
    body, _, tag = text.rpartition(" #")
    return hashlib.sha256(body.encode()).hexdigest()[:16] == tag


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --- the writer (runs in a forked child) --------------------------------------------------


def writer(path: str, seed: int, ack_path: str, slot: int | None = None) -> None:
    """Write until killed. Each line of ``ack_path`` is a JSON list: [event, ...].
    ``slot``: one of several writers of the store, touching only its own memories (those
    whose metadata says ``"w": slot``), no evictions."""
    import fastmem

    ack_fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def ack(*msg: Any) -> None:
        os.write(ack_fd, (json.dumps(msg) + "\n").encode())

    rng = random.Random(seed)
    if seed % 2:  # a small tail limit: writes start checkpoints in a thread (fastmem.storage.checkpoint)
        from fastmem.storage import index as _index

        _index.CHECKPOINT_TAIL_ROWS = 16
    ack("phase", "open")
    warnings.simplefilter("ignore")
    store = fastmem.open(path, durability="always", dim=4, embedder=None, policy=fastmem.ContextPolicy(preload=0, recent=0))
    live = [m.id for m in store if slot is None or (m.metadata or {}).get("w") == slot]
    own = {} if slot is None else {"w": slot}  # in every metadata this writer writes
    ack("ready")
    i = 0
    while True:
        i += 1
        r = rng.random()
        if slot is not None and 0.77 <= r < 0.83:
            r = rng.random() * 0.77  # no evictions among several writers: another's memories would go
        if r < 0.45 or not live:
            text = _text(seed, i, rng)
            meta = {"seed": seed, "i": i, **own}
            session = f"s{rng.randint(0, 4)}"
            ack("adding", digest(text))
            mid = store.add(text, metadata=meta, session=session, timestamp=1e9 + (seed % 10**6) * 1e3 + i,
                            embedding=[rng.random() + 0.01 for _ in range(4)])  # fmt: skip
            live.append(mid)
            ack("add", mid, digest(text), meta, session)
        elif r < 0.55:
            ack("phase", "add_many")
            items = []
            for j in range(rng.randint(2, 5)):
                text = _text(seed, i * 100 + j, rng)
                items.append({"text": text, "metadata": {"j": j, **own}, "session": "batch"})
                ack("adding", digest(text), "batch")
            ids = store.add_many(items)
            for mid, item in zip(ids, items):
                live.append(mid)
                ack("add", mid, digest(item["text"]), item["metadata"], "batch")
        elif r < 0.65:
            mid = rng.choice(live)
            meta = {"updated": i, **own}
            ack("updating", mid, meta)
            store.update(mid, metadata=meta, importance=rng.random())
            ack("updated", mid, meta)
        elif r < 0.77:
            mid = live.pop(rng.randrange(len(live)))
            ack("forgetting", mid)
            store.forget(mid)
            ack("forgot", mid)
        elif r < 0.83:
            keep = max(0, len(live) - rng.randint(1, 8))
            ack("phase", "evict")
            ack("evicting")
            gone = store.evict(max_count=keep)
            ack("evicted", gone)
            live = [m for m in live if m not in set(gone)]
        elif r < 0.91:
            ack("phase", "checkpoint")
            store.checkpoint()
            ack("phase", "done")
        else:
            ack("phase", "compact")
            store.compact()
            ack("phase", "done")
        if slot is not None and len(live) > 40:  # small, by forgets of its own
            for mid in live[:8]:
                ack("forgetting", mid)
                store.forget(mid)
                ack("forgot", mid)
            live = live[8:]
        elif len(live) > 150:  # keep the store small: checking it after each kill stays quick
            ack("phase", "evict")
            ack("evicting")
            gone = store.evict(max_count=60)
            ack("evicted", gone)
            live = [m for m in live if m not in set(gone)]


def compactor(path: str, seed: int, ack_path: str) -> None:
    """Compact the store (now and then checkpoint it) in a loop until killed, beside the
    writers: their appends go on into the file a compaction swaps."""
    import fastmem

    ack_fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def ack(*msg: Any) -> None:
        os.write(ack_fd, (json.dumps(msg) + "\n").encode())

    rng = random.Random(seed)
    ack("phase", "open")
    warnings.simplefilter("ignore")
    store = fastmem.open(path, durability="always", dim=4, embedder=None, policy=fastmem.ContextPolicy(preload=0, recent=0))
    while True:
        step = "checkpoint" if rng.random() < 0.3 else "compact"
        ack("phase", step)
        store.checkpoint() if step == "checkpoint" else store.compact()
        ack("phase", "done")
        time.sleep(rng.uniform(0.0, 0.02))


# --- the fork server -------------------------------------------------------------------------


def serve() -> None:
    """Read commands on stdin: ``run <path> <seed> <ack file> <role>`` forks a writer (role
    ``solo``, or ``w<slot>`` for one of several) or the compaction loop (``compactor``) and
    answers its pid; ``wait <pid>`` reaps it and answers its wait status."""
    import numpy  # noqa: F401  - imported once here, not once per writer

    import fastmem  # noqa: F401
    from fastmem.tokens import TokenCounter

    TokenCounter().encoding  # noqa: B018 - tiktoken caches it: every writer starts with it
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "run":
            path, seed, ack_path, role = args
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    if role == "compactor":
                        compactor(path, int(seed), ack_path)
                    else:
                        writer(path, int(seed), ack_path, None if role == "solo" else int(role[1:]))
                except BaseException as exc:  # a bug: let the harness see it (where, too)
                    import traceback

                    where = " | ".join(line.strip() for line in traceback.format_tb(exc.__traceback__)[-6:])
                    with open(ack_path, "a") as f:
                        f.write(json.dumps(["error", f"{role} {exc!r} at {where}"]) + "\n")
                    code = 1
                os._exit(code)
            print(pid, flush=True)
        elif cmd == "wait":
            _, status = os.waitpid(int(args[0]), 0)
            print(status, flush=True)


class ForkServer:
    def __init__(self) -> None:
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env,
        )  # fmt: skip
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in, self._out = self.proc.stdin, self.proc.stdout
        if self._out.readline().strip() != "ready":
            raise RuntimeError("the fork server did not start")

    def _ask(self, line: str) -> str:
        self._in.write(line + "\n")
        self._in.flush()
        return self._out.readline().strip()

    def run(self, path: str, seed: int, ack_path: str, role: str = "solo") -> int:
        return int(self._ask(f"run {path} {seed} {ack_path} {role}"))

    def wait(self, pid: int) -> int:
        return int(self._ask(f"wait {pid}"))

    def close(self) -> None:
        self._in.close()
        self.proc.wait(timeout=30)
        self._out.close()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._in.closed:
            self.close()


# --- the checker ------------------------------------------------------------------------------


@dataclass
class Model:
    """What the writers acknowledged, across kills."""

    memories: dict[str, tuple[str, Any, str]] = field(default_factory=dict)  # id -> digest, meta, session
    maybe_meta: dict[str, list[Any]] = field(default_factory=dict)  # updates in flight
    maybe_gone: set[str] = field(default_factory=set)  # forgets or evictions in flight
    in_flight: set[str] = field(default_factory=set)  # digests of adds not acknowledged
    kills: int = 0
    acked: int = 0
    lost: int = 0
    garbled: int = 0
    unclean: int = 0
    duplicates: int = 0  # memories there twice (the same text under two ids)
    phases: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))
    errors: list[str] = field(default_factory=list)

    def read_acks(self, ack_path: str) -> str:
        """Apply one writer's acknowledgements; returns the phase it was killed in."""
        phase, pending_evict = "open", False
        for line in Path(ack_path).read_text().splitlines():
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue  # cannot happen with one write per line; tolerated all the same
            kind = msg[0]
            if kind == "error":
                self.errors.append(msg[1])
            elif kind == "phase":
                phase = msg[1]
            elif kind == "ready":
                phase = "add"
            elif kind == "adding":
                self.in_flight.add(msg[1])
                if len(msg) == 2:
                    phase = "add"
            elif kind == "add":
                if msg[1] in self.memories:
                    self.errors.append(f"id {msg[1]} was handed out twice")
                self.memories[msg[1]] = (msg[2], msg[3], msg[4])
                self.acked += 1
                self.in_flight.discard(msg[2])
            elif kind == "updating":
                self.maybe_meta.setdefault(msg[1], []).append(msg[2])
                phase = "update"
            elif kind == "updated":
                digest_, _, session = self.memories[msg[1]]
                self.memories[msg[1]] = (digest_, msg[2], session)
                self.maybe_meta.pop(msg[1], None)
            elif kind == "forgetting":
                self.maybe_gone.add(msg[1])
                phase = "forget"
            elif kind == "forgot":
                self.memories.pop(msg[1], None)
                self.maybe_gone.discard(msg[1])
            elif kind == "evicting":
                pending_evict = True
            elif kind == "evicted":
                pending_evict = False
                for mid in msg[1]:
                    self.memories.pop(mid, None)
        if pending_evict:  # killed during an eviction: any memory may be gone
            self.maybe_gone.update(self.memories)
        return phase if phase in PHASES else "add"  # "done": between steps

    def check(self, path: str, keep: str | None = None) -> bool:
        """Open the store as the next writer would and hold it to the model; then resolve
        what was in flight from what is there. False when the store does not open or read
        (an unclean result, counted): its files are copied to the directory ``keep`` (when
        given) and removed, and the model starts afresh (the next writer creates the store)."""
        import fastmem

        try:
            self._check(path)
            return True
        except fastmem.FastmemError as exc:
            self.unclean += 1
            self.errors.append(f"after kill {self.kills}: the store does not open or read: {exc!r}")
            for name in os.listdir(os.path.dirname(path) or "."):
                full = os.path.join(os.path.dirname(path), name)
                if name.startswith(os.path.basename(path)):
                    if keep is not None:
                        os.makedirs(keep, exist_ok=True)
                        shutil.copy(full, os.path.join(keep, f"kill{self.kills}-{name}"))
                    if not name.endswith(".acks"):
                        os.remove(full)
            self.memories.clear()
            self.maybe_meta.clear()
            self.maybe_gone.clear()
            self.in_flight.clear()
            return False

    def _check(self, path: str) -> None:
        import fastmem

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fastmem.RecoveryWarning)
            store = fastmem.open(path, durability="none", embedder=None, policy=fastmem.ContextPolicy(preload=0, recent=0))
        with store:
            report = store.verify()
            if not report.ok:
                self.unclean += 1
                self.errors.append(f"verify after kill {self.kills}: {report.problems[:3]}")
            present = {}
            texts: set[str] = set()
            for m in store:
                if m.text in texts:
                    self.duplicates += 1
                    self.errors.append(f"kill {self.kills}: {m.id} is there twice: {m.text[:60]!r}")
                texts.add(m.text)
                if not self_checked(m.text):
                    self.garbled += 1
                    self.errors.append(f"garbled {m.id}: {m.text[:60]!r}")
                present[m.id] = m
            for mid, (digest_, meta, session) in list(self.memories.items()):
                m = present.get(mid)
                if m is None:
                    if mid in self.maybe_gone:
                        del self.memories[mid]  # the forget or eviction happened
                        continue
                    self.lost += 1
                    self.errors.append(f"kill {self.kills}: acknowledged {mid} is lost")
                    del self.memories[mid]
                    continue
                metas = [meta, *self.maybe_meta.get(mid, [])]
                if digest(m.text) != digest_ or m.session != session or m.metadata not in metas:
                    self.garbled += 1
                    self.errors.append(f"kill {self.kills}: {mid} differs: {m}")
                    continue
                self.memories[mid] = (digest_, m.metadata, session)  # an in-flight update landed or not
            for mid, m in present.items():
                if mid not in self.memories and digest(m.text) not in self.in_flight:
                    self.garbled += 1
                    self.errors.append(f"kill {self.kills}: {mid} was never written: {m.text[:60]!r}")
                elif mid not in self.memories:  # an add in flight that made it: it is real now
                    self.memories[mid] = (digest(m.text), m.metadata, m.session or "")
        self.maybe_meta.clear()
        self.maybe_gone.clear()
        self.in_flight.clear()


def run_kills(path: str, kills: int, seed: int = 0, max_delay: float = 0.06,
              log: Any = None, hang: float = 300.0) -> Model:  # fmt: skip
    """``kills`` rounds of fork a writer, SIGKILL it at a random moment, check the store.

    The moment is chosen by the writer's progress, not by the clock alone: on a loaded
    machine a writer may still be opening the store (and acknowledge nothing) after any
    fixed delay. One round in four kills up to ``max_delay`` s after the fork (during the
    open's recovery, too); the others wait until the writer has written a random number of
    acknowledgement lines (1 to 24), then kill it up to ``max_delay`` s later. A writer
    that writes no line for ``hang`` s is an error, and so is one that ends by itself."""
    rng = random.Random(seed)
    model = Model()
    ack_path = path + ".acks"
    with ForkServer() as server:
        for k in range(kills):
            Path(ack_path).write_text("")
            pid = server.run(path, seed * 1_000_003 + k, ack_path)
            lines = 0 if rng.random() < 0.25 else rng.randint(1, 24)
            if not _wait_for_lines(ack_path, lines, hang):
                model.errors.append(f"kill {k}: the writer wrote no line for {hang:g} s")
            time.sleep(rng.uniform(0.0, max_delay))
            os.kill(pid, signal.SIGKILL)
            status = server.wait(pid)
            if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
                model.errors.append(f"kill {k}: the writer ended by itself ({status})")
            model.kills += 1
            model.phases[model.read_acks(ack_path)] += 1
            model.check(path)
            if log is not None and (k + 1) % 500 == 0:
                log(f"{k + 1} kills: acked {model.acked}, lost {model.lost}, garbled "
                    f"{model.garbled}, unclean {model.unclean}, phases {model.phases}")  # fmt: skip
    return model


def run_rounds(path: str, rounds: int, writers: int = 4, seed: int = 0, max_delay: float = 0.06,
               log: Any = None, hang: float = 300.0, keep: str | None = None) -> Model:  # fmt: skip
    """``rounds`` rounds of: fork ``writers`` writers and a compaction loop on one store,
    SIGKILL each of them in a random order at a random moment of its progress (as
    :func:`run_kills` chooses it; the others write on meanwhile), check the store.
    ``writers + 1`` kills a round. ``keep``: where the files of a store that does not open
    or read after a round are copied (then the store starts afresh)."""
    rng = random.Random(seed)
    model = Model()
    roles = [f"w{slot}" for slot in range(writers)] + ["compactor"]
    with ForkServer() as server:
        for k in range(rounds):
            procs = []
            for n, role in enumerate(roles):
                ack_path = f"{path}.{role}.acks"
                Path(ack_path).write_text("")
                procs.append((server.run(path, (seed * 1_000_003 + k) * 8 + n, ack_path, role), ack_path))
            rng.shuffle(procs)
            for pid, ack_path in procs:
                lines = 0 if rng.random() < 0.25 else rng.randint(1, 24)
                if not _wait_for_lines(ack_path, lines, hang):
                    model.errors.append(f"round {k}: {ack_path} had no line for {hang:g} s")
                time.sleep(rng.uniform(0.0, max_delay))
                os.kill(pid, signal.SIGKILL)
            errors = len(model.errors)
            for pid, ack_path in procs:
                status = server.wait(pid)
                if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
                    model.errors.append(f"round {k}: {ack_path}'s process ended by itself ({status})")
                model.kills += 1
                model.phases[model.read_acks(ack_path)] += 1
            if not model.check(path, keep) and log is not None:
                log(f"round {k}: the store does not open or read (files kept in {keep})")
            for error in model.errors[errors:] if log is not None else ():
                log(f"round {k}: {error}")
            if log is not None and (k + 1) % 100 == 0:
                log(f"{model.kills} kills ({k + 1} rounds): acked {model.acked}, lost {model.lost}, "
                    f"duplicates {model.duplicates}, garbled {model.garbled}, unclean {model.unclean}, "
                    f"phases {model.phases}")  # fmt: skip
    return model


def _wait_for_lines(ack_path: str, lines: int, hang: float) -> bool:
    """Wait until ``ack_path`` holds ``lines`` lines or an error line (the writer ended);
    False when no new line came for ``hang`` seconds."""
    seen, last_progress = -1, time.monotonic()
    while True:
        text = Path(ack_path).read_text()
        count = text.count("\n")
        if count >= lines or '["error"' in text:
            return True
        if count != seen:
            seen, last_progress = count, time.monotonic()
        elif time.monotonic() - last_progress > hang:
            return False
        time.sleep(0.002)


if __name__ == "__main__" and sys.argv[1:] == ["serve"]:
    serve()
