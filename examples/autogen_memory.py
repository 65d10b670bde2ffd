# requires: autogen_core autogen_agentchat autogen_ext
"""fastmem as an AutoGen agent's memory, offline: AutoGen's replay model stands in for an LLM.

The first agent is told a fact (``remember_user_messages``) and is given one explicitly
(``add``); a second agent, with a new ``FastmemMemory`` on the same files (as after a
restart), is asked about them: fastmem's context for the question is in the model's input.
"""

import asyncio
import tempfile

from autogen_agentchat.agents import AssistantAgent
from autogen_core.memory import MemoryContent, MemoryMimeType
from autogen_ext.models.replay import ReplayChatCompletionClient

from fastmem.integrations.autogen import FastmemMemory


async def main(root: str) -> None:
    # One line replaces ListMemory(): a store per user under `root`.
    memory = FastmemMemory(root, namespace="alice", remember_user_messages=True)
    await memory.add(MemoryContent(content="Alice prefers answers in metric units.",
                                   mime_type=MemoryMimeType.TEXT))
    agent = AssistantAgent("assistant", model_client=ReplayChatCompletionClient(["Noted!"]),
                           memory=[memory])
    await agent.run(task="My sister Jo lives in Bergen.")
    await memory.close()

    # "Restart": a new memory and agent on the same files.
    memory = FastmemMemory(root, namespace="alice")
    model = ReplayChatCompletionClient(["Jo lives in Bergen; it is about 500 km from Oslo."])
    agent = AssistantAgent("assistant", model_client=model, memory=[memory])
    result = await agent.run(task="Where does my sister live, and how far is it from Oslo?")
    await memory.close()

    sent = model.create_calls[0]["messages"]  # what the model was given
    print("The model's input:")
    for message in sent:
        print(f"  [{type(message).__name__}] {message.content}")
    print("The agent answered:", result.messages[-1].content)
    assert any("Bergen" in str(m.content) for m in sent if type(m).__name__ == "SystemMessage")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as root:
        asyncio.run(main(root))
