"""``fastmem demo``: an agent's session written by one process, read back by a fresh one.

The parent (``run``) starts two child processes, as an agent's life would go:

1. ``python -m fastmem.cli.demo write PATH``: an agent session of user and assistant turns, a
   tool result, a plan and a fact the user asked to remember (pinned), after a few earlier
   sessions; then the process ends.
2. ``python -m fastmem.cli.demo restart PATH``: a fresh process, as after a restart: import,
   open + ``recent()`` (level 1), the level-2 preload, then the packed context for a
   question about an early part of the session (level 3), counted exactly with tiktoken.

Each child prints JSON lines (events) on stdout; the parent shows them with rich, drawing
the preload's progress live, or prints them as one JSON document with ``--json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from ..errors import EmbedderUnavailableError, FastmemError, InvalidInputError
from ..namespaces import base_path

__all__ = ["run", "SESSION", "QUESTION"]

DAY = 86400.0
QUESTION = "When and where is my sister's wedding, and what did I say about the food there?"
ANSWER_MARKER = "Ana is getting married"  # the early turn the question is about

# The session the demo is about: (role or type, text). Roles become conversation turns
# with metadata {"role": ...}; other entries are memories of that type.
SESSION: list[tuple[str, str]] = [
    ("user", "Hi! I need help planning a trip to Portugal in June."),
    ("assistant", "Happy to help. What's the occasion, and which dates are fixed?"),
    ("user", "My sister Ana is getting married in Porto on Saturday 14 June, at the Quinta da "
             "Aveleda. I'm vegetarian, and I'm worried the wedding dinner will be all bacalhau."),
    ("assistant", "Congratulations to Ana! I'll plan around the 14th in Porto. I can draft a "
                  "note to the caterer asking for a vegetarian main; Portuguese caterers "
                  "usually offer one if asked a few weeks ahead."),
    ("user", "Yes please, draft that. Also, remember this: I'm allergic to cashews, always "
             "check for them."),
    ("fact", "The user is allergic to cashews: check every dish and product for them."),
    ("assistant", "Noted, and I'll keep it in mind for everything I suggest. Here's the draft "
                  "for the caterer: 'Dear Quinta da Aveleda team, I'm a guest at Ana's wedding "
                  "on 14 June. I'm vegetarian and allergic to cashews; could you prepare a "
                  "vegetarian main without nuts? Thank you!'"),
    ("user", "Perfect. I'll fly from Berlin. I'd like to arrive Thursday the 12th and leave "
             "Monday the 16th."),
    ("tool_result", "flight_search BER→OPO 12 Jun: TP 543 dep 06:25 arr 08:45, 1 stop LIS, "
                    "212 EUR | FR 1416 dep 10:05 arr 12:30, direct, 89 EUR + 35 EUR bag | "
                    "EW 8960 dep 17:40 arr 20:05, direct, 146 EUR incl. bag"),
    ("assistant", "Three options for Thursday 12 June: Ryanair FR 1416 direct at 10:05 (89 EUR, "
                  "124 with a checked bag), Eurowings EW 8960 direct at 17:40 (146 EUR with a "
                  "bag), or TAP via Lisbon at 06:25 (212 EUR). If you're bringing a suit or a "
                  "dress, the Eurowings fare with the bag included is the calmest choice."),
    ("user", "Let's go with the Eurowings one. For the return, anything Monday afternoon?"),
    ("tool_result", "flight_search OPO→BER 16 Jun: EW 8961 dep 20:50 arr 00:55(+1), 131 EUR "
                    "incl. bag | FR 1417 dep 13:00 arr 17:20, 74 EUR + 35 EUR bag"),
    ("assistant", "For Monday the 16th: Ryanair FR 1417 at 13:00 (109 EUR with a bag) lands at "
                  "17:20; Eurowings EW 8961 at 20:50 lands after midnight. I'd take the "
                  "Ryanair one so you're home the same evening."),
    ("user", "Agreed. Where should I stay? Somewhere walkable, not too far from the venue."),
    ("assistant", "Quinta da Aveleda is in Penafiel, about 40 minutes east of Porto. Staying in "
                  "Porto's Ribeira or Baixa is walkable and lively; the family will likely "
                  "arrange a shuttle to the quinta. Do you want me to look for hotels there?"),
    ("user", "Yes, Baixa please, under 150 EUR a night."),
    ("tool_result", "hotel_search Porto Baixa 12-16 Jun ≤150 EUR: Hotel Aliados 4* 138 EUR "
                    "rating 8.7 | Moov Hotel Porto Centro 3* 94 EUR rating 8.3 | Casa dos "
                    "Loios 4* 149 EUR rating 9.1, breakfast included"),
    ("assistant", "Casa dos Loios (149 EUR, breakfast included, rated 9.1) is the best value "
                  "for four nights; Moov Centro at 94 EUR if you'd rather save."),
    ("user", "Casa dos Loios sounds lovely. Book the flights and the hotel, and remind me to "
             "buy a wedding gift."),
    ("plan", "Trip to Porto for Ana's wedding: 1) book EW 8960 BER→OPO Thu 12 Jun 17:40; "
             "2) book FR 1417 OPO→BER Mon 16 Jun 13:00; 3) book Casa dos Loios 12-16 Jun; "
             "4) send the vegetarian, cashew-free meal request to the caterer; 5) buy a "
             "wedding gift from Ana's registry before 1 June."),
    ("assistant", "Here's the plan I'll follow: flights EW 8960 out and FR 1417 back, Casa dos "
                  "Loios for four nights, the caterer note, and a reminder for the gift before "
                  "1 June. I'll confirm each booking with you before paying."),
    ("user", "Great. Unrelated: what's a good vegetarian dish I could cook this weekend?"),
    ("assistant", "Try a mushroom and chestnut bourguignon with mashed potatoes: rich, "
                  "hearty, and nut-safe if you skip the cashew cream some recipes add."),
    ("user", "Sounds good. Thanks, that's all for today."),
    ("assistant", "You're welcome! I'll pick up the bookings next time."),
]

# What the agent wrote as each tool result's summary, by the search's route or city.
TOOL_SUMMARIES = {
    "BER→OPO": "Flights Berlin→Porto 12 Jun: Ryanair 10:05 direct 124 EUR with bag; Eurowings "
               "17:40 direct 146 EUR with bag; TAP 06:25 via Lisbon 212 EUR.",
    "OPO→BER": "Flights Porto→Berlin 16 Jun: Ryanair 13:00 109 EUR with bag; Eurowings 20:50 "
               "131 EUR with bag.",
    "Porto": "Hotels in Porto Baixa 12-16 Jun: Casa dos Loios 149 EUR (9.1, breakfast), Hotel "
             "Aliados 138 EUR (8.7), Moov Centro 94 EUR (8.3).",
}

# Earlier sessions, to give the store some history: (session topic, user turn, reply).
HISTORY: list[tuple[str, str, str]] = [
    ("work", "Can you summarise the Q2 roadmap doc?", "The Q2 roadmap has three themes: "
     "onboarding speed, the billing migration and the mobile offline mode."),
    ("work", "Who owns the billing migration?", "Priya owns it; the cut-over is planned for "
     "the second week of May."),
    ("work", "Remind me what the offline mode needs.", "A local cache of the last 30 days, "
     "conflict resolution on reconnect, and a sync status indicator."),
    ("running", "How should I train for a 10k in eight weeks?", "Three runs a week: one easy, "
     "one interval session, one long run that grows from 6 to 11 km."),
    ("running", "My knee hurts after long runs.", "Ease off the long run for a week, add "
     "strength work for the hips, and see a physio if it persists."),
    ("cooking", "What's a quick weeknight dinner?", "A chickpea and spinach curry takes 25 "
     "minutes and keeps well for lunch."),
    ("cooking", "Any good tofu marinade?", "Soy sauce, rice vinegar, garlic, ginger and a "
     "little maple syrup; press the tofu first."),
    ("reading", "Recommend a novel like Station Eleven.", "Try 'The Dispossessed' by Ursula "
     "K. Le Guin or 'Sea of Tranquility' by Emily St. John Mandel."),
    ("reading", "What's my reading goal this year?", "You set 24 books for the year; you've "
     "logged 9 so far."),
    ("home", "The kitchen tap is dripping.", "It's usually the cartridge or a washer; turn "
     "off the supply under the sink before opening it."),
    ("home", "When is the rent due?", "On the 1st of each month, by bank transfer to Mr. "
     "Keller."),
    ("language", "Teach me a Portuguese greeting.", "'Bom dia' (good morning), 'boa tarde' "
     "(good afternoon), and 'obrigado/obrigada' for thank you."),
    ("language", "How do I say 'I'm vegetarian' in Portuguese?", "'Sou vegetariano' (or "
     "'vegetariana')."),
]
HISTORY_DAYS = 6  # each earlier day repeats the topics with that day's turns


class DemoFailedError(FastmemError):
    """A process of the demo failed (the CLI reports it as one line, exit 1)."""


def _writer_embedder() -> tuple[Any, str | None]:
    """The default embedder, or ``None`` and why the demo runs on keywords."""
    if os.environ.get("FASTMEM_EMBEDDER") == "none":
        return None, "FASTMEM_EMBEDDER=none"
    from ..embed import default_embedder

    try:
        return default_embedder(), None
    except EmbedderUnavailableError as exc:
        return None, " ".join(str(exc).split())


def _items(now: float) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    start = now - (HISTORY_DAYS + 1) * DAY
    for day in range(HISTORY_DAYS):
        t = start + day * DAY + 9 * 3600
        for i, (topic, question, reply) in enumerate(HISTORY):
            session = f"day{day + 1}-{topic}"
            if (i + day) % 3 == 0:
                continue  # not every topic every day
            prefix = "" if day == 0 else f"(day {day + 1}) "
            items.append({"text": prefix + question, "session": session, "timestamp": t,
                          "metadata": {"role": "user"}})  # fmt: skip
            items.append({"text": reply, "session": session, "timestamp": t + 20,
                          "metadata": {"role": "assistant"}})  # fmt: skip
            t += 600
    t = now - 3600
    for kind, text in SESSION:
        item: dict[str, Any] = {"text": text, "session": "porto-trip", "timestamp": t}
        if kind in ("user", "assistant"):
            item["metadata"] = {"role": kind}
        else:
            item["type"] = kind
        if kind == "fact":
            item["pinned"] = True  # the user said "remember this"
        if kind == "tool_result":
            item["metadata"] = {"tool": text.split(" ", 1)[0]}
            item["summary"] = TOOL_SUMMARIES[text.split(" ", 2)[1]]  # as an agent would write
        items.append(item)
        t += 75
    return items


def _emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def write(path: str) -> None:
    """Child 1: the agent's session, written; the process then ends."""
    import fastmem

    embedder, why = _writer_embedder()
    started = time.perf_counter()
    items = _items(time.time())
    with fastmem.open(path, embedder=embedder) as store:
        if embedder is not None:
            embedder.wait()  # the session's embeddings are part of writing it
        ids = store.add_many(items)
    _emit(event="written", memories=len(ids), seconds=time.perf_counter() - started,
          embedder=None if embedder is None else getattr(embedder, "name", "default"),
          keywords_only=why, session_memories=len(SESSION))  # fmt: skip


# Child 2's command: the clock starts before fastmem is imported.
RESTART = ("import sys, time; t0 = time.perf_counter(); import fastmem; "
           "from fastmem.cli.demo import restart; restart(sys.argv[1], sys.argv[2:] == ['--keywords'], t0)")


def restart(path: str, keywords_only: bool, t0: float) -> None:
    """Child 2: a fresh process, as after an agent restart (``t0``: before the import)."""
    import fastmem
    from ..embed import default_embedder

    t_import = time.perf_counter() - t0
    embedder = None if keywords_only else default_embedder()
    t1 = time.perf_counter()
    store = fastmem.open(path, embedder=embedder)
    t2 = time.perf_counter()
    recent = store.recent(6)
    t3 = time.perf_counter()
    _emit(event="restart", import_seconds=t_import, open_seconds=t2 - t1,
          recent_seconds=t3 - t2, backend=fastmem.BACKEND, memories=len(store),
          recent=[{"id": m.id, "type": m.type, "role": (m.metadata or {}).get("role"),
                   "text": m.text} for m in recent])  # fmt: skip
    # Level 2 runs in the background; watch it without calling the store (a call would
    # make it wait for a quiet moment).
    while not store.wait_preload(0.01):
        done, total = store.preload_progress
        _emit(event="preload", done=done, total=total, seconds=time.perf_counter() - t3)
    done, total = store.preload_progress
    _emit(event="preload", done=done, total=total, seconds=time.perf_counter() - t3, finished=True)

    first = store.context(QUESTION, budget=1300)
    first_at = time.perf_counter() - t0
    if embedder is not None:
        embedder.wait()  # full quality: the query embedding against the stored vectors
    ctx = store.context(QUESTION, budget=1300)
    answer = next((m.id for m in store if ANSWER_MARKER in m.text), None)
    recount = store.tokens.count(ctx.text)  # the exact count, again, from the text alone
    report = store.verify()
    store.close()
    _emit(event="context", question=QUESTION, first_degraded=first.degraded,
          first_tokens=first.tokens, first_seconds=first.seconds, first_since_start=first_at,
          text=ctx.text, tokens=ctx.tokens, recount=recount, budget=ctx.budget,
          encoding=ctx.encoding, degraded=ctx.degraded, seconds=ctx.seconds,
          items=len(ctx.items), answer_id=answer,
          answer_found=answer in {i.id for i in ctx.items},
          levels={str(level): sum(i.level == level for i in ctx.items) for level in (0, 1, 3)},
          verify_ok=report.ok)  # fmt: skip


# --- the parent ---------------------------------------------------------------------------


def _child(args: list[str], on_event: Any) -> None:
    """Run ``python ARGS`` with this process's fastmem; pass each event on."""
    source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fastmem/cli/
    env = dict(os.environ)
    env["PYTHONPATH"] = source + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # Safe-path mode (3.11+) and a working directory outside any checkout: with ``-m``/``-c``
    # Python puts the working directory first on sys.path, so a demo started in the
    # repository imported its source tree (no compiled kernels) instead of this fastmem.
    env["PYTHONSAFEPATH"] = "1"
    with subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          cwd=tempfile.gettempdir()) as proc:  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            on_event(json.loads(line))
        err = proc.stderr.read()  # read after stdout: it holds a warning or an error at most
    if proc.returncode != 0:
        last = err.strip().splitlines()[-1] if err.strip() else f"exit status {proc.returncode}"
        raise DemoFailedError(f"a process of the demo failed: {last}")


def run(path: str | None, out: Any) -> int:
    """``fastmem demo``: see the module docstring. ``out`` is the CLI's output (``_Out``).

    Returns the exit code: 0, or 1 when the context's recount or ``verify()`` disagrees.
    Fails with fastmem's errors, which the CLI maps to its exit codes: this module does
    not import the CLI (which imports it).

    Raises:
        InvalidInputError: ``path`` already holds a store (exit 2).
        DemoFailedError: a process of the demo failed (exit 1).
    """
    temporary = path is None
    if path is None:
        directory = tempfile.mkdtemp(prefix="fastmem-demo-")
        path = os.path.join(directory, "agent_memory")
    else:
        path = os.path.abspath(base_path(path))
        if os.path.exists(path + ".dat"):
            raise InvalidInputError(f"{path}.dat already exists: the demo writes a new store; "
                                    f"give another --path")  # fmt: skip
    events: dict[str, Any] = {"path": path, "temporary": temporary}
    try:
        return _run(path, out, events, temporary)
    finally:
        if temporary:
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def _run(path: str, out: Any, events: dict[str, Any], temporary: bool) -> int:
    console = out.console
    show = not out.json

    def keep(event: dict[str, Any]) -> None:
        events[event.pop("event")] = event

    with out.progress("writing an agent session (and embedding it)", None):
        _child(["-m", "fastmem.cli.demo", "write", path], keep)
    written = events["written"]
    if show:
        _show_written(console, path, written, temporary)
    with out.progress("level-2 preload", None) as advance:
        state = {"done": 0}

        def on_restart(event: dict[str, Any]) -> None:
            if event["event"] == "preload" and show:
                advance(event["done"] - state["done"])
                state["done"] = event["done"]
            if event["event"] == "preload" and not event.get("finished"):
                return
            keep(event)

        _child(["-c", RESTART, path] + (["--keywords"] if written["keywords_only"] else []), on_restart)
    _check_kernels(events["restart"]["backend"])
    if out.json:
        out.emit(events)
    else:
        _show_restart(console, events)
    ok = events["context"]["verify_ok"] and events["context"]["recount"] == events["context"]["tokens"]
    return 0 if ok else 1


def _check_kernels(backend: str) -> None:
    """Fail loudly when the fresh process ran the numpy fallback without being asked to:
    the demo's timings would then show the slow kernels, not fastmem's."""
    if backend != "cython" and os.environ.get("FASTMEM_BACKEND") != "python":
        raise DemoFailedError(
            "the demo's processes ran the numpy fallback kernels: fastmem's compiled kernels "
            "did not load (build them with 'python setup.py build_ext --inplace' in a checkout, "
            "or 'pip install .'); FASTMEM_BACKEND=python runs the demo on the fallback anyway"
        )


def _show_written(console: Any, path: str, written: dict[str, Any], temporary: bool) -> None:
    from rich.markup import escape

    where = "a temporary directory, removed at the end" if temporary else escape(path)
    console.rule("[bold]1. an agent writes its session, then its process ends")
    console.print(f"{written['memories']} memories ({written['session_memories']} in today's "
                  f"session 'porto-trip', the rest from {HISTORY_DAYS} earlier days) written to "
                  f"{where} in {written['seconds']:.2f} s")  # fmt: skip
    if written["keywords_only"]:
        console.print(f"[yellow]keywords only[/yellow] (no embeddings): {escape(written['keywords_only'])}; "
                      f"fastmem doctor says what is missing")  # fmt: skip
    else:
        console.print(f"embedded with {escape(written['embedder'])} (semantic + keyword search)")


def _show_restart(console: Any, events: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    r, p, c = events["restart"], events["preload"], events["context"]
    console.rule("[bold]2. a fresh process reopens the store, as after a restart")
    console.print(f"import fastmem {1000 * r['import_seconds']:.0f} ms · "
                  f"[bold]open {1000 * r['open_seconds']:.2f} ms + recent(6) "
                  f"{1000 * r['recent_seconds']:.2f} ms[/bold] · {r['memories']} memories, "
                  f"{r['backend']} kernels")  # fmt: skip
    table = Table(title="level 1: the conversation continues from here (newest first)",
                  title_justify="left", show_lines=False)  # fmt: skip
    table.add_column("id")
    table.add_column("who / type")
    table.add_column("text", overflow="fold")
    for m in r["recent"]:
        text = m["text"] if len(m["text"]) <= 110 else m["text"][:109] + "…"
        table.add_row(m["id"], escape(m["role"] or m["type"]), escape(text))
    console.print(table)
    console.print(f"level 2: the {p['total']} most important memories preloaded in the "
                  f"background in {1000 * p['seconds']:.0f} ms ({p['done']}/{p['total']}), "
                  f"without blocking the agent")  # fmt: skip
    console.rule("[bold]3. a question about the start of the session")
    console.print(f"context({escape(repr(c['question']))}, budget={c['budget']})")
    if c["degraded"]:
        console.print("[yellow]keywords only[/yellow]: the context is ranked by keywords, "
                      "recency and importance (no embedding model)")  # fmt: skip
    elif c["first_degraded"]:
        console.print(f"first context {1000 * c['first_since_start']:.0f} ms after the process "
                      f"started, while the model was still loading: {c['first_tokens']} tokens "
                      f"from keywords, recency and importance; with the model ready:")  # fmt: skip
    found = (f"[green]contains {c['answer_id']}[/green], the early turn that answers it"
             if c["answer_found"] else "[red]does not contain the early turn that answers it[/red]")
    exact = "exact" if c["recount"] == c["tokens"] else f"recount {c['recount']}"
    console.print(Panel(
        Text(c["text"]), title="the context a model would get", title_align="left",
        subtitle=(f"{c['tokens']} / {c['budget']} {c['encoding']} tokens ({exact}, tiktoken), "
                  f"{c['items']} memories, {1000 * c['seconds']:.1f} ms"),
        subtitle_align="left",
    ))  # fmt: skip
    console.print(f"The context {found}; pinned {c['levels']['0']}, recent {c['levels']['1']}, "
                  f"found by search {c['levels']['3']}. verify(): "
                  + ("[green]ok[/green]" if c["verify_ok"] else "[red]problems[/red]"))  # fmt: skip


def _main(argv: list[str]) -> None:
    if len(argv) >= 2 and argv[0] == "write":
        write(argv[1])
    else:
        sys.stderr.write("usage: python -m fastmem.cli.demo write PATH\n")
        raise SystemExit(2)


if __name__ == "__main__":
    _main(sys.argv[1:])
