"""MCP tool servers: the configuration file, connections that heal, and the tools they offer."""
