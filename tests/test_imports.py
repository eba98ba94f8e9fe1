"""What the code imports: starting the bot imports the `mcp` SDK only once an MCP server is used (its HTTP client,
httpx2, comes with the openai SDK anyway), no module of core/, adapters/ or bot/ imports itself back, and none is too
long."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grimp

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


def test_no_import_circle() -> None:
    """No module reaches itself again through its imports, function-local and TYPE_CHECKING ones included, a package's
    __init__ too (pyproject.toml's acyclic_siblings contract sees packages as wholes, but not a circle through one's
    __init__)."""
    graph = grimp.build_graph("core", "adapters", "bot", cache_dir=None)
    circles: dict[frozenset[str], str] = {}
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                circles.setdefault(frozenset(back), " → ".join((importer, *back)))
    assert not circles, "import circles:\n" + "\n".join(sorted(circles.values()))


def test_no_product_file_is_too_long_to_read_and_core_stays_a_facade() -> None:
    """The house's size rules (issue 33): no module of core/, adapters/ or bot/ over 500 lines, and `Core` (the
    facade in core/front_door.py) under 250: new work gets a room of its own instead of widening them."""
    lines = {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for folder in ("core", "adapters", "bot")
        for path in (ROOT / folder).rglob("*.py")
    }
    assert {path: n for path, n in lines.items() if n > 500} == {}
    assert lines["core/front_door.py"] < 250
