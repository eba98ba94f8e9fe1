"""What starting the bot imports: the `mcp` SDK only once an MCP server is used (its HTTP client, httpx2, comes with
the openai SDK anyway)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_starting_the_bot_imports_no_mcp_sdk() -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "TELEGRAM_", "DISCORD_", "MCP_"))}
    base["PYTHONPATH"] = str(ROOT)
    code = "import core, bot.__main__, sys; print('mcp' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], env=base, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
