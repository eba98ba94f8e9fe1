"""Capabilities, the tools the agent writes itself: their versioned store, checks, runtime and managing tools."""
