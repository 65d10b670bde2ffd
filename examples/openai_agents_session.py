# requires: agents
"""fastmem as an OpenAI Agents SDK session, offline: a scripted model stands in for an LLM.

One conversation is run, the store is closed (as when the process stops), and the same
conversation goes on with a new ``FastmemSession`` on the same files: its history is in the
model's input. A second conversation, with ``memory_instructions``, recalls what the first
one said through fastmem's context, put in front of the agent's own instructions.
"""

import asyncio
import os
import tempfile

from agents import Agent, Runner, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

import fastmem
from fastmem.integrations.openai_agents import FastmemSession, memory_instructions

set_tracing_disabled(True)  # offline: no trace export


def text_of(item: dict) -> str:
    content = item.get("content")
    return content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)


class ScriptedModel(Model):
    """A stand-in for a model: says "Noted." and prints what it was given."""

    async def get_response(self, system_instructions, input, *args, **kwargs):
        print("  model instructions:", (system_instructions or "").replace("\n", " | "))
        print("  model input:", [text_of(item) for item in input if "role" in item])
        text = ResponseOutputText(type="output_text", text="Noted.", annotations=[])
        message = ResponseOutputMessage(id="msg", type="message", role="assistant",
                                        status="completed", content=[text])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


async def main(path: str) -> None:
    agent = Agent(name="assistant", instructions="Be brief.", model=ScriptedModel())
    # One line replaces SQLiteSession("trip", "conversations.db"):
    session = FastmemSession("trip", path, embedder=None)
    print("first process:")
    await Runner.run(agent, "I'm flying to Lisbon on the 3rd of June.", session=session)
    session.close()

    print("after a restart, the same conversation:")
    session = FastmemSession("trip", path, embedder=None)
    await Runner.run(agent, "When do I fly?", session=session)
    session.close()

    print("a new conversation, recalling through the instructions:")
    with fastmem.open(path, embedder=None) as store:
        other = FastmemSession("packing", store)
        agent = Agent(name="assistant", model=ScriptedModel(),
                      instructions=memory_instructions(store, "Be brief.", session=other))
        await Runner.run(agent, "Where am I flying to?", session=other)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(main(os.path.join(directory, "memory")))
