"""An OpenAI Agents SDK session of 10,000 items: ``FastmemSession`` beside the SDK's own
``SQLiteSession`` (file-backed), in one run, and the adapter's overhead over the store calls
it wraps.

    cd /work/main
    PYTHONPATH=$PWD python benchmarks/agents_session.py --items 10000 --rounds 3
    PYTHONPATH=$PWD python benchmarks/agents_session.py --items 2000 --embedder default

Rows (each the best of ``--rounds`` rounds, each round on new files):
- ``add_items bulk``: one ``add_items`` call with every item.
- ``add_items turns``: one call per turn of four items (user message, tool call, tool
  output, assistant message), as a runner saves a conversation.
- ``get_items first``: the first read of the whole session after the bulk add (fastmem's
  waits for the index checkpoint the bulk add started in a thread).
- ``get_items all``: the whole session (what a runner reads with no limit): the median of
  ``--reads`` calls after that first one, the two sessions read in turns.
- ``get_items 20``: the newest 20 (``SessionSettings(limit=20)``), as ``get_items all``.
- ``pop_item``: 100 pops.
Both sessions write their files in a temporary directory on the same disk, with their own
durability defaults: SQLiteSession commits each call (WAL, no fsync per commit by default:
``synchronous=FULL`` is SQLite's default in WAL mode only with an fsync at checkpoints);
fastmem's ``durability="batch"`` (on disk within ~5 ms). Unfair to fastmem: it also writes a
readable line per item, a summary and a keyword index (and with ``--embedder default`` an
embedding), which is what lets ``memory_instructions`` recall from the items; SQLiteSession
stores the JSON alone. Unfair to SQLite: fastmem keeps many sessions' items in one store
and scans the index for a session, SQLite has an index on (session_id, id).

The overhead rows time the same work through the store alone (``add_many`` of the
records the session builds, ``recent(session=...)`` of the memories it reads) and report
the adapter's share: JSON encoding and decoding, the readable line, the thread hop. The
``adk overhead`` rows do the same for ``FastmemMemoryService`` (``--adk`` events, the same
conversation's lines as text): ``add_events_to_memory`` against ``add_many`` of its records,
``search_memory`` against ``MemoryStore.context`` (20 queries, the same budget).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agents.memory import SQLiteSession

import fastmem
from fastmem.integrations.openai_agents import FastmemSession, render


def make_items(n: int) -> list[dict[str, Any]]:
    """``n`` items of a plausible conversation: turns of a user message, a tool call, its
    output and the assistant's answer (about 100-400 characters each)."""
    items: list[dict[str, Any]] = []
    for turn in range(n // 4 + 1):
        city = ("Lisbon", "Zürich", "Kyoto", "Lima")[turn % 4]
        items += [
            {"role": "user", "content": f"Turn {turn}: what is the weather in {city} and "
                                        f"should I pack an umbrella for my trip on day {turn}?"},
            {"type": "function_call", "call_id": f"call_{turn}", "name": "get_weather",
             "arguments": f'{{"city": "{city}", "day": {turn}}}', "id": f"fc_{turn}"},
            {"type": "function_call_output", "call_id": f"call_{turn}",
             "output": f'{{"city": "{city}", "temp_c": {turn % 30}, "rain_mm": {turn % 7}, '
                       f'"wind": "NW {turn % 40} km/h", "summary": "partly cloudy"}}'},
            {"id": f"msg_{turn}", "type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "annotations": [], "text":
                          f"In {city} on day {turn} it will be {turn % 30} °C with "
                          f"{turn % 7} mm of rain, so an umbrella is "
                          f"{'a good idea' if turn % 7 > 2 else 'not needed'}. Anything else?"}]},
        ]  # fmt: skip
    return items[:n]


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    t0 = time.perf_counter()
    await call()
    return time.perf_counter() - t0


async def one_round(items: list[dict[str, Any]], reads: int, embedder: str) -> dict[str, float]:
    """Seconds of each row for both sessions (new files), plus the store-alone rows."""
    out: dict[str, float] = {}
    turns = [items[i : i + 4] for i in range(0, len(items), 4)]
    with tempfile.TemporaryDirectory() as d:
        options: dict[str, Any] = {} if embedder == "default" else {"embedder": None}

        def sessions(tag: str) -> tuple[Any, Any]:
            return (SQLiteSession(tag, os.path.join(d, f"{tag}.db")),
                    FastmemSession(tag, os.path.join(d, tag), **options))  # fmt: skip

        for name, batches in (("add_items bulk", [items]), ("add_items turns", turns)):
            sq, fm = sessions(name.split()[-1])
            for label, session in (("sqlite", sq), ("fastmem", fm)):
                async def add(session: Any = session, batches: list = batches) -> None:
                    for batch in batches:
                        await session.add_items(batch)

                out[f"{name}|{label}"] = await timed(add)
            assert len(await fm.get_items()) == len(items) == len(await sq.get_items())
            if name == "add_items bulk":
                bulk_sq, bulk_fm = sq, fm
            else:
                sq.close()
                fm.close()
        # The first read after the bulk add, alone: fastmem's waits for the index checkpoint
        # that a bulk add of thousands starts in a thread (the add's deferred work).
        for label, session in (("sqlite", bulk_sq), ("fastmem", bulk_fm)):
            out[f"get_items first|{label}"] = await timed(session.get_items)
        # Reads in turns (SQLite first, then fastmem first, ...), the median of each side: on
        # a shared machine the load drifts within a round, and a median of interleaved reads
        # is what it disturbs least.
        for limit, row in ((None, "get_items all"), (20, "get_items 20")):
            times: dict[str, list[float]] = {"sqlite": [], "fastmem": []}
            for i in range(reads):
                pair = (("sqlite", bulk_sq), ("fastmem", bulk_fm))
                for label, session in pair if i % 2 == 0 else pair[::-1]:
                    times[label].append(await timed(lambda s=session, n=limit: s.get_items(n)))
            for label, seconds in times.items():
                out[f"{row}|{label}"] = statistics.median(seconds)
        for label, session in (("sqlite", bulk_sq), ("fastmem", bulk_fm)):
            async def pop(session: Any = session) -> None:
                for _ in range(100):
                    await session.pop_item()

            out[f"pop_item x100|{label}"] = await timed(pop)
        bulk_sq.close()
        bulk_fm.close()
        # The store alone: the same records, the same reads, without the session.
        with fastmem.open(os.path.join(d, "alone"), **options) as store:
            shim = FastmemSession("alone", store)
            records = shim._records(items)
            t0 = time.perf_counter()
            store.add_many(records)
            out["core add_many|fastmem"] = time.perf_counter() - t0
            store.recent(1, session="alone")  # not timed: waits for the add's checkpoint
            t0 = time.perf_counter()
            for _ in range(reads):
                store.recent(1 << 62, session="alone")
            out["core recent(session) all|fastmem"] = (time.perf_counter() - t0) / reads
            t0 = time.perf_counter()
            for _ in range(reads):
                await shim.get_items()
            out["adapter get_items all|fastmem"] = (time.perf_counter() - t0) / reads
            shim2 = FastmemSession("alone2", store)
            out["adapter add_items bulk|fastmem"] = await timed(lambda: shim2.add_items(items))
    return out


async def adk_overhead(n: int, queries: int) -> dict[str, float]:
    """``FastmemMemoryService`` over the store calls it wraps, for one user with ``n``
    events: ``add_events_to_memory`` (one call) against ``add_many`` of the same records
    (the session's dedup read included: it is part of the adapter's work), and
    ``search_memory`` against ``MemoryStore.context`` with the same query and budget."""
    from google.adk.events import Event
    from google.genai import types

    from fastmem.integrations import adk

    items = make_items(n)
    events = [Event(id=f"e{i}", author="user" if i % 2 == 0 else "assistant", timestamp=1.7e9 + i,
                    invocation_id="inv", content=types.Content(role="user", parts=[
                        types.Part(text=render(item)[0])]))
              for i, item in enumerate(items)]  # fmt: skip
    words = ["umbrella Lisbon", "rain in Kyoto", "weather day 17", "wind Lima", "Zürich sunny"]
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d:
        service = adk.FastmemMemoryService(os.path.join(d, "svc"), embedder=None)
        # Warm-up, not timed: the store's creation and the token encoder's first load.
        await service.add_events_to_memory(app_name="app", user_id="u", events=events[:1],
                                           session_id="warm-up")  # fmt: skip
        t0 = time.perf_counter()
        await service.add_events_to_memory(app_name="app", user_id="u", events=events,
                                           session_id="s")  # fmt: skip
        out["adapter add_events"] = time.perf_counter() - t0
        records = [adk._event_record(e, "s") for e in events]
        with fastmem.open(os.path.join(d, "alone"), embedder=None) as store:
            store.add_many([adk._event_record(events[0], "warm-up")])
            t0 = time.perf_counter()
            store.add_many(records)
            out["core add_many"] = time.perf_counter() - t0
            for q in words:  # warm both
                store.context(q, service.budget)
                await service.search_memory(app_name="app", user_id="u", query=q)
            t0 = time.perf_counter()
            for i in range(queries):
                store.context(words[i % len(words)], service.budget)
            out["core context"] = (time.perf_counter() - t0) / queries
            t0 = time.perf_counter()
            for i in range(queries):
                await service.search_memory(app_name="app", user_id="u", query=words[i % len(words)])
            out["adapter search_memory"] = (time.perf_counter() - t0) / queries
        await service.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reads", type=int, default=5)
    parser.add_argument("--embedder", choices=("none", "default"), default="none",
                        help="fastmem's embedder: none (keyword index only) or the default model")  # fmt: skip
    parser.add_argument("--adk", type=int, default=2000, metavar="N",
                        help="events for the ADK service's overhead rows (0: none)")
    args = parser.parse_args()
    items = make_items(args.items)
    rounds = [asyncio.run(one_round(items, args.reads, args.embedder)) for _ in range(args.rounds)]
    best = {key: min(r[key] for r in rounds) for key in rounds[0]}
    print(f"# {args.items} items, best of {args.rounds} rounds, embedder={args.embedder}; "
          f"{platform.machine()} {os.cpu_count()} cpus, Python {sys.version.split()[0]}, "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'row':<22} {'SQLiteSession':>14} {'FastmemSession':>15} {'fastmem/sqlite':>15}")
    rows = ("add_items bulk", "add_items turns", "get_items first", "get_items all", "get_items 20",
            "pop_item x100")  # fmt: skip
    for row in rows:
        sq, fm = best[f"{row}|sqlite"], best[f"{row}|fastmem"]
        print(f"{row:<22} {sq * 1e3:>11.2f} ms {fm * 1e3:>12.2f} ms {fm / sq:>14.2f}x")
    for row, core, adapter in (("add_items bulk", "core add_many", "adapter add_items bulk"),
                               ("get_items all", "core recent(session) all",
                                "adapter get_items all")):  # fmt: skip
        c, a = best[f"{core}|fastmem"], best[f"{adapter}|fastmem"]
        print(f"overhead {row:<16} store {c * 1e3:.2f} ms, session {a * 1e3:.2f} ms: "
              f"+{(a - c) / c * 100:.0f}%")


    if args.adk:
        runs = [asyncio.run(adk_overhead(args.adk, 20)) for _ in range(args.rounds)]
        adk_best = {key: min(r[key] for r in runs) for key in runs[0]}
        for row, core, adapter in (("add_events_to_memory", "core add_many", "adapter add_events"),
                                   ("search_memory", "core context", "adapter search_memory")):
            c, a = adk_best[core], adk_best[adapter]
            print(f"adk overhead {row:<21} store {c * 1e3:.2f} ms, service {a * 1e3:.2f} ms: "
                  f"+{(a - c) / c * 100:.0f}%")


if __name__ == "__main__":
    main()
