"""The MCP Mesh console: a web page for the local mesh, served by `mcpctl console`."""
