"""Write an agent's memories, end the process, reopen the store in a fresh one: they are there,
and the context for the next question is built from them.

Run: python examples/restart.py [store path]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

WRITE = """
import sys, fastmem
with fastmem.open(sys.argv[1]) as store:
    store.add("User: I'm planning a trip to Lisbon in May.", session="day-1")
    store.add("Assistant: Noted. Want me to track flights?", session="day-1")
    store.add("flights LIS: TAP 1351 dep 07:10, 189 EUR", type="tool_result", session="day-1",
              metadata={"tool": "flight_search"})
    store.add("Book the hotel before March 1st.", type="plan", session="day-1")
    store.add("The user is vegetarian.", type="fact", pinned=True, session="day-1")
print("wrote 5 memories and exited")
"""

READ = """
import sys, time
t0 = time.perf_counter()
import fastmem
t1 = time.perf_counter()
print(f"fastmem {fastmem.__version__}, {fastmem.BACKEND} kernels")
with fastmem.open(sys.argv[1]) as store:
    recent = store.recent(20)
    t2 = time.perf_counter()
    print(f"restart: import {1000 * (t1 - t0):.1f} ms, open + recent(20) {1000 * (t2 - t1):.2f} ms")
    for m in reversed(recent):
        pin = " (pinned)" if m.pinned else ""
        print(f"  {m.id:>3} {m.type:<12} {m.text}{pin}")
    question = "Which flight should I book, and what can the user eat on board?"
    ctx = store.context(question, budget=200)
    t3 = time.perf_counter()
    state = "keywords only: the model was still loading" if ctx.degraded else "full quality"
    print(f"context({question!r}): {ctx.tokens} tokens, {1000 * (t3 - t2):.1f} ms, {state}")
    store._embedder.wait()
    ctx = store.context(question, budget=200)
    print(f"once the model is ready: {ctx.tokens} tokens, {1000 * ctx.seconds:.1f} ms")
    print(ctx.text)
    print("verify:", "ok" if store.verify().ok else store.verify().problems)
"""


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.mkdtemp(), "agent_memory")
    path = os.path.abspath(path)
    # The children run beside the store, so that they import the installed fastmem.
    here = os.path.dirname(path)
    subprocess.run([sys.executable, "-c", WRITE, path], check=True, cwd=here)
    print(f"a fresh process reopens {path}.dat / .idx:")
    subprocess.run([sys.executable, "-c", READ, path], check=True, cwd=here)


if __name__ == "__main__":
    main()
