"""Why each line of a context is there: the provenance ``context()`` returns.

A small memory: a pinned fact, a conversation about a trip, a budget changed since. For a
question and a tight budget, print every line the model would read with its level, its
tokens and the reason it was chosen, then the memories that ranked well but did not fit.
The same facts ``fastmem context --explain`` prints and ``fastmem ui`` shows.
"""

import os
import tempfile

import fastmem

with (
    tempfile.TemporaryDirectory() as folder,
    fastmem.open(os.path.join(folder, "agent"), embedder=None) as store,
):
    store.add("The user's name is Ada; she prefers short answers.", type="fact", pinned=True)
    old = store.add("Lisbon trip budget: 1,200 EUR in total.", type="fact", timestamp=1.7e9)
    for i, turn in enumerate(
        [
            "user: I want to plan a trip to Lisbon in the spring.",
            "assistant: Lisbon in April is mild. Flights from Berlin?",
            "user: Yes, and keep the whole trip under 1,200 euros.",
            "user: Flights cost more than I thought: raise the Lisbon budget.",
            "assistant: With 1,500 EUR the guesthouse and direct flights both fit.",
        ]
    ):
        store.add(turn, session="trip", timestamp=1.7e9 + 60 * (i + 1))
    store.add(
        "Lisbon trip budget: 1,500 EUR in total.",
        type="fact",
        supersedes=old,
        timestamp=1.7e9 + 600,
    )

    ctx = store.context("What is the Lisbon trip budget?", budget=70)
    print(f"{ctx.tokens} of {ctx.budget} tokens\n")
    for item in ctx.items:
        print(f"{item.level.name:<7} {item.tokens:>3} tok  {item.line}")
        print(f"{'':<16}why: {item.reason}")
    print("\nranked well, did not fit:")
    for item in ctx.left_out:
        print(f"  {item.id:<4} {item.tokens:>3} tok  {item.reason}")
