"""Matrix adapter (issue 37): mautrix's ClientAPI in front of the core (adapter.py), split by job: incoming, reply,
render, send (replies, mentions, edits, direct rooms, files), commands (`!tasks`), buttons and presses (reactions),
files (the media repository). `config_problem` checks the settings without loading mautrix (bot/ runs it before starting
anything); MatrixAdapter is imported on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from adapters.matrix.config import config_problem, enabled

if TYPE_CHECKING:
    from adapters.matrix.adapter import MatrixAdapter

__all__ = ["MatrixAdapter", "config_problem", "enabled"]


def __getattr__(name: str) -> Any:
    """MatrixAdapter, imported with mautrix only when asked for (a module __getattr__, PEP 562)."""
    if name == "MatrixAdapter":
        from adapters.matrix.adapter import MatrixAdapter

        return MatrixAdapter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
