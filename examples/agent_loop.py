"""An agent loop with memory: recall before each answer, remember after it.

Two conversations with a restart between them, as when an agent's process is stopped and
started again. A stand-in replaces the language model (the example runs offline): it only
reports which remembered lines it was given, which shows what a real model would see.
"""

from __future__ import annotations

import os
import tempfile

import fastmem


def stand_in_model(messages: list[dict[str, str]]) -> str:
    """A stand-in for a chat model: quotes the remembered line closest to the question."""
    memory = messages[0]["content"] if messages[0]["role"] == "system" else ""
    question = set(messages[-1]["content"].lower().split())
    lines = [line for line in memory.splitlines() if line and not line.startswith("## ")]
    best = max(lines, key=lambda line: len(question & set(line.lower().split())), default="-")
    return f"(from {len(lines)} remembered lines, the closest: {best})"


def turn(store: fastmem.MemoryStore, session: str, message: str) -> str:
    """One turn: a context for the message, the model's reply, both stored."""
    ctx = store.context(message, budget=400, session=session)
    reply = stand_in_model([*ctx.messages, {"role": "user", "content": message}])
    store.add_many([
        {"text": f"user: {message}", "session": session},
        {"text": f"assistant: {reply}", "session": session},
    ])
    print(f"[{session}] user: {message}\n[{session}]   context {ctx.tokens} tokens -> {reply}")
    return reply


with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "assistant")

    with fastmem.open(path) as store:  # the first process
        store.add("The user's name is Dana; she prefers short answers.", type="fact",
                  pinned=True)
        turn(store, "monday", "My flight to Lisbon is TP 533 on Friday at 07:10.")
        turn(store, "monday", "Remind me to book a taxi to the airport.")
        store.add("Book a taxi to the airport for Friday 05:30.", type="plan", session="monday")

    with fastmem.open(path) as store:  # after a restart: a new session
        turn(store, "thursday", "What time is my flight tomorrow?")
        ctx = store.context("What time is my flight tomorrow?", session="thursday")
        assert "TP 533" in ctx.text, "the flight from Monday's session should be recalled"
        print(f"{len(store)} memories; the flight number is in Thursday's context: yes")
