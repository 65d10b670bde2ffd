"""One process of ``tests/test_processes.py``: a read-write handle on a shared store.

    python tests/procs_worker.py STORE ACKS SEED SECONDS [--compact]

Until SECONDS have passed, and it has written, read (and compacted) at least once (on a
loaded machine the imports and the open alone may outlast SECONDS: progress ends it, not
the clock; the test's hang guard catches a worker that never gets there), it interleaves
``add_many``, ``add``, ``forget``, ``update`` and reads. After each write returns it
appends one line to the shared acknowledgement file ACKS (one ``write()`` on an
``O_APPEND`` descriptor: lines never interleave, though a reader may catch the last one
half-copied, and a SIGKILL may cut one short), so that every process knows what was
acknowledged, and when. Before each read it takes the lines acknowledged so far (by any
process) and checks that the read sees them: a memory whose add was acknowledged before
the read began must be there (those meant to be forgotten are never checked: their owner
may forget them meanwhile). A failed check is written to ACKS as a ``miss`` line; the
test fails on any. ``--compact`` also compacts.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import warnings

import fastmem

DURABLE, EPHEMERAL = "durable", "ephemeral"  # ephemeral memories may be forgotten by their owner


def main() -> None:
    path, acks_path, seed, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    compacts = "--compact" in sys.argv[5:]
    warnings.simplefilter("ignore", fastmem.RecoveryWarning)  # a killed writer's torn tail, cut
    rng = random.Random(seed)
    acks = os.open(acks_path, os.O_WRONLY | os.O_APPEND)
    counts = {"writes": 0, "reads": 0, "compactions": 0}
    wanted = ("writes", "reads", "compactions") if compacts else ("writes", "reads")

    def ack(**line: object) -> None:
        os.write(acks, (json.dumps(line) + "\n").encode())

    mine: list[str] = []  # my ephemeral ids still live
    deadline = time.monotonic() + seconds
    n = 0
    # A generous lock timeout: on a loaded machine a compaction may hold the lock for seconds,
    # and this test is about what every process sees, not about how fast.
    policy = fastmem.ContextPolicy(preload=0, recent=0)
    with fastmem.open(path, embedder=None, policy=policy, timeout=120) as store:
        while time.monotonic() < deadline or not all(counts[k] for k in wanted):
            op = rng.random()
            if op < 0.25:
                batch = [_item(seed, n + j, rng) for j in range(rng.randint(1, 5))]
                n += len(batch)
                ids = store.add_many(batch)
                for mid, item in zip(ids, batch):
                    ack(op="add", id=mid, text=item["text"], kind=item["session"], t=time.time())
                    if item["session"] == EPHEMERAL:
                        mine.append(mid)
                counts["writes"] += 1
            elif op < 0.35:
                item = _item(seed, n, rng)
                n += 1
                mid = store.add(item["text"], session=item["session"])
                ack(op="add", id=mid, text=item["text"], kind=item["session"], t=time.time())
                if item["session"] == EPHEMERAL:
                    mine.append(mid)
                counts["writes"] += 1
            elif op < 0.45 and mine:
                mid = mine.pop(rng.randrange(len(mine)))
                store.forget(mid)
                ack(op="forget", id=mid, t=time.time())
                counts["writes"] += 1
            elif op < 0.55 and mine:
                mid = rng.choice(mine)
                importance = round(rng.random(), 3)
                store.update(mid, importance=importance)
                ack(op="update", id=mid, importance=importance, t=time.time())
                counts["writes"] += 1
            elif compacts and op < 0.58:
                store.compact()
                counts["compactions"] += 1
            else:
                _check_read(store, acks_path, rng, ack)
                counts["reads"] += 1
    ack(op="done", seed=seed, **counts)


def read_acks(path: str) -> list[dict]:
    """The acknowledgement lines complete so far.

    The kernel copies a write into the page cache page by page, so a reader can see the end of
    a line still being written; and a SIGKILL stops a write between pages, leaving a torn line
    that the next writer's line follows. Neither was acknowledged: both are skipped.
    """
    with open(path, "rb") as f:
        *complete, _unfinished = f.read().split(b"\n")
    lines = []
    for raw in complete:
        try:
            lines.append(json.loads(raw))
        except ValueError:
            continue  # torn by a kill
    return lines


def _item(seed: int, i: int, rng: random.Random) -> dict[str, str]:
    kind = EPHEMERAL if rng.random() < 0.3 else DURABLE
    return {"text": f"w{seed}x{i} token{seed}q{i} " + "filler " * rng.randint(0, 30), "session": kind}


def _check_read(store: fastmem.MemoryStore, acks_path: str, rng: random.Random, ack) -> None:  # type: ignore[no-untyped-def]
    lines = read_acks(acks_path)
    durable = [line for line in lines if line["op"] == "add" and line["kind"] == DURABLE]
    if not durable:
        return
    probe = durable[-10:] + rng.sample(durable, min(10, len(durable)))
    how = rng.choice(("get", "contains", "search", "len"))
    for line in probe:
        if how == "get":
            ok = store.get(line["id"]).text == line["text"]
        elif how == "contains":
            ok = line["id"] in store
        elif how == "search":
            word = line["text"].split()[1]  # a token no other memory has
            ok = any(h.id == line["id"] for h in store.search(word, k=3, mode="keyword"))
        else:
            ok = len(store) >= len(durable)
        if not ok:
            ack(op="miss", how=how, id=line["id"], t=time.time())


if __name__ == "__main__":
    main()
