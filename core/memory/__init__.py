"""Per-user memory: core memory blocks in the prompt, archival memory and conversation search, with tools."""
