"""The basics: remember, restart, recall.

Writes a small store in a temporary directory, closes it as a process would at exit, opens it
again and asks for the context a model would get. Runs offline in a few seconds.
"""

from __future__ import annotations

import os
import tempfile

import fastmem

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "agent")  # the store is agent.dat + agent.idx

    with fastmem.open(path) as store:
        store.add("The user is vegetarian and allergic to cashews.", type="fact", pinned=True)
        paris = store.add("The user lives in Paris.", type="fact")
        store.add("The user moved to Berlin in May.", type="fact", supersedes=paris)
        store.add_many([
            {"text": "user: Can you plan a trip to Porto for my sister's wedding?",
             "session": "trip"},
            {"text": "assistant: Sure. Flights on 12 June, back on 16 June.", "session": "trip"},
            {"text": "Hotel: Casa dos Loios, four nights, breakfast included.",
             "type": "tool_result", "session": "trip"},
        ])

    # A restart: a new handle reads the same two files (open takes about a millisecond).
    with fastmem.open(path) as store:
        print(f"{len(store)} memories; newest: {store.recent(1)[0].text!r}")
        for hit in store.search("hotel in Porto", k=2):
            print(f"  search hit {hit.memory.id}: {hit.memory.text!r} (score {hit.score:.2f})")

        ctx = store.context("Where does the user live, and what can they eat?", budget=300)
        print(f"context: {ctx.tokens} tokens (budget {ctx.budget}), {len(ctx.items)} memories")
        print(ctx.text)
        assert "Berlin" in ctx.text and "Paris" not in ctx.text  # the newest truth only

        report = store.verify()
        print(f"verify: ok={report.ok}, {report.records} records")
