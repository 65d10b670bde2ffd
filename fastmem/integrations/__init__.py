"""fastmem where agents are: a Hermes Agent memory provider (hermes) and an MCP server (mcp)."""
