# requires: llama_index.core
"""fastmem as a LlamaIndex memory block, offline: LlamaIndex's mock LLM stands in for a model.

``Memory`` keeps the recent chat and flushes older messages to its memory blocks; the
fastmem block stores them and, before each model call, returns fastmem's context for the
user's message. A second ``Memory`` on the same files (as after a restart, in a new
session) recalls what was said in the first.
"""

import asyncio
import tempfile

from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms.mock import MockLLMWithChatMemoryOfLastCall
from llama_index.core.memory import Memory
from sqlalchemy.ext.asyncio import create_async_engine

from fastmem.integrations.llamaindex import FastmemMemoryBlock


async def chat(root: str, session_id: str, turns: list[str]) -> MockLLMWithChatMemoryOfLastCall:
    """A chat of ``turns`` with a fresh Memory; returns the model, which kept its last input."""
    block = FastmemMemoryBlock(path=root, namespace="alice")
    # Memory's own chat store (the recent messages) is in memory, as by default, on an
    # engine of our own so that it can be closed; a file database would keep it too.
    database = create_async_engine("sqlite+aiosqlite:///:memory:")
    memory = Memory.from_defaults(
        session_id=session_id,
        memory_blocks=[block],  # the one line that adds fastmem
        # A small chat history (for the demo): older messages flush to the blocks sooner.
        token_limit=200, chat_history_token_ratio=0.5, token_flush_size=20,
        async_engine=database,
    )
    llm = MockLLMWithChatMemoryOfLastCall(max_tokens=3)  # answers "text text text"
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    for turn in turns:
        await engine.achat(turn)
    await block.aclose()
    await database.dispose()
    return llm


async def main(root: str) -> None:
    planning = [f"Let us plan task number {i} of the week." for i in range(8)]
    await chat(root, "monday", ["My sister Jo lives in Bergen.", *planning])
    llm = await chat(root, "tuesday", ["Where does my sister live?"])  # a new session
    print("The model's input:")
    for message in llm.last_chat_messages:
        print(f"  [{message.role.value}] {message.content}")
    assert "Bergen" in llm.last_chat_messages[0].content


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as root:
        asyncio.run(main(root))
