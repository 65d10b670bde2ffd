# requires: google.adk
"""fastmem as a Google ADK memory service, offline: a scripted model stands in for Gemini.

Alice tells the agent a fact; her session is added to memory (as an app does at a
session's end). In a new session, with a new service on the same files (as after a
restart), ADK's ``preload_memory`` tool puts what fastmem recalls for her question in the
model's request. Bob, another user, gets nothing of Alice's.
"""

import asyncio
import tempfile
from collections.abc import AsyncGenerator

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.tools import preload_memory
from google.genai import types

from fastmem.integrations.adk import FastmemMemoryService


class ScriptedLlm(BaseLlm):
    """A stand-in for a model: says "Noted." and prints the recalled part of its request."""

    model: str = "scripted"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        texts = [p.text for c in llm_request.contents for p in c.parts or [] if p.text]
        recalled = [t for t in texts if "PAST_CONVERSATIONS" in t]
        print("  model was reminded:", recalled[0].split("<PAST_CONVERSATIONS>")[1].split(
            "</PAST_CONVERSATIONS>")[0].strip().replace("\n", " | ") if recalled else "nothing")
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text="Noted.")]))


async def turn(root: str, user: str, session_id: str, text: str) -> None:
    # One line replaces InMemoryMemoryService(): a store per (app, user) under `root`.
    memory = FastmemMemoryService(root, embedder=None)
    sessions = InMemorySessionService()
    agent = LlmAgent(name="assistant", model=ScriptedLlm(), instruction="Be brief.",
                     tools=[preload_memory])
    runner = Runner(agent=agent, app_name="demo", session_service=sessions,
                    memory_service=memory)
    await sessions.create_session(app_name="demo", user_id=user, session_id=session_id)
    message = types.Content(role="user", parts=[types.Part(text=text)])
    print(f"{user}: {text}")
    async for _ in runner.run_async(user_id=user, session_id=session_id, new_message=message):
        pass
    done = await sessions.get_session(app_name="demo", user_id=user, session_id=session_id)
    await memory.add_session_to_memory(done)
    await memory.close()


async def main(root: str) -> None:
    await turn(root, "alice", "monday", "My bike is a green Brompton.")
    await turn(root, "alice", "tuesday", "Which bike do I ride?")
    await turn(root, "bob", "tuesday", "Which bike do I ride?")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(main(directory))
