"""The bot's self-written tools: the author's guide (README.md) and examples; run-time code lives under DATA_DIR."""
