"""The agent: the model loop, the LLM client and its providers, the system prompt, and history replay."""
