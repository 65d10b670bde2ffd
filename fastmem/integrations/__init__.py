"""fastmem where agents are: a memory provider for Hermes Agent (``hermes``), an MCP server
(``mcp_server``), and one module per agent framework (``langgraph``, ``openai_agents``,
``adk``, ``autogen``, ``llamaindex``), each an extra of its own. Part of the edge: these import
the public API only (``fastmem``, ``errors``, ``types``, ``namespaces``, ``export``,
``embed``, ``tokens``, ``summarize``, ``doctor``) and each other, and ``import fastmem`` never
imports them or a framework."""
