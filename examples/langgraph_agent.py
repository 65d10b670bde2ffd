# requires: langgraph
"""fastmem as a LangGraph store, offline: a scripted chat model stands in for an LLM.

A small graph whose one node stores what the user asks it to remember in the user's
namespace and, for any other message, puts fastmem's context from that namespace in front
of the model. The store is closed between the two runs, as when the process stops; the
second run, on the same files, finds the fact. Another user's namespace never sees it.
"""

import os
import tempfile
import uuid

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.store.base import BaseStore

from fastmem.integrations.langgraph import FastmemStore

seen = []  # what the model was given, turn by turn


class Model(GenericFakeChatModel):
    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        seen.append([m.content for m in messages])
        return super()._generate(messages, stop, run_manager, **kwargs)


model = Model(messages=iter(["I remember."] * 10))


def agent(state: MessagesState, config, *, store: BaseStore):
    user = config["configurable"]["user"]
    text = state["messages"][-1].content
    if text.startswith("remember:"):
        store.put(("memories", user), uuid.uuid4().hex, {"text": text.removeprefix("remember:").strip()})
        return {"messages": [AIMessage("Noted.")]}
    context = store.context(("memories", user), text, budget=300)  # fastmem's packed context
    return {"messages": [model.invoke([SystemMessage(f"You remember:\n{context.text}"), HumanMessage(text)])]}


builder = StateGraph(MessagesState)
builder.add_node("agent", agent)
builder.add_edge(START, "agent")
builder.add_edge("agent", END)

path = os.path.join(tempfile.mkdtemp(), "agent_memory")


def say(user, text):
    with FastmemStore(path) as store:  # was: InMemoryStore() or SqliteStore(...)
        graph = builder.compile(store=store)
        graph.invoke({"messages": [HumanMessage(text)]}, {"configurable": {"user": user}})


say("alice", "remember: My sister Ada moved to Lisbon in May.")
say("alice", "Where does my sister live?")  # a new store on the same files
say("bob", "Where does my sister live?")

print("alice's model saw:", seen[0][0].replace("\n", " | "))
print("bob's model saw:  ", seen[1][0].replace("\n", " | "))
assert "Lisbon" in seen[0][0] and "Lisbon" not in seen[1][0]
