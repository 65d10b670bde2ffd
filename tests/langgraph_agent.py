"""A small LangGraph agent over a FastmemStore, run as its own process by test_langgraph.py.

    python tests/langgraph_agent.py STORE USER MESSAGE   # one turn; prints the model's input
    python tests/langgraph_agent.py --write STORE TAG N  # N puts of keys TAG-0.. (one per batch)

A message starting ``remember:`` is stored as a fact in the user's namespace
(``("memories", USER)``); any other is answered by a scripted offline chat model
(langchain_core's ``GenericFakeChatModel``) given fastmem's context for it from that
namespace. The turn prints, as JSON, the texts of the messages the model received.
"""

from __future__ import annotations

import json
import sys
import uuid
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.store.base import BaseStore
from pydantic import Field

from fastmem.integrations.langgraph import FastmemStore


class RecordingModel(GenericFakeChatModel):
    """A scripted chat model that keeps the messages it was given."""

    seen: list[list[str]] = Field(default_factory=list)

    def _generate(self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        self.seen.append([str(m.content) for m in messages])
        return super()._generate(messages, stop, run_manager, **kwargs)


def build(model: RecordingModel, user: str) -> Any:
    def agent(state: MessagesState, *, store: BaseStore) -> dict[str, Any]:
        text = str(state["messages"][-1].content)
        namespace = ("memories", user)
        if text.startswith("remember:"):
            store.put(namespace, uuid.uuid4().hex, {"text": text.removeprefix("remember:").strip()})
            return {"messages": [AIMessage("Noted.")]}
        context = store.context(namespace, text, 300)  # type: ignore[attr-defined]
        reply = model.invoke([SystemMessage(f"What you remember:\n{context.text}"), HumanMessage(text)])
        return {"messages": [reply]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder


def turn(path: str, user: str, message: str) -> list[list[str]]:
    model = RecordingModel(messages=iter(["Here is what I know."] * 4))
    with FastmemStore(path) as store:
        graph = build(model, user).compile(store=store)
        graph.invoke({"messages": [HumanMessage(message)]})
    return model.seen


def write(path: str, tag: str, n: int) -> None:
    with FastmemStore(path, index={"fields": ["text"]}) as store:
        for i in range(n):
            store.put(("shared",), f"{tag}-{i}", {"text": f"note {i} from {tag}", "i": i})
            store.put(("shared",), "last-writer", {"text": tag, "i": i})


if __name__ == "__main__":
    if sys.argv[1] == "--write":
        write(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        print(json.dumps(turn(sys.argv[1], sys.argv[2], sys.argv[3])))
