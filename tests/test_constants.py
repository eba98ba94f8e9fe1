"""core.quoting.truncate at its boundaries, and every fixed limit kept in core/constants.py or its platform's limits."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from core.quoting import truncate

ROOT = Path(__file__).resolve().parent.parent
HOMES = {
    "core/constants.py",
    "adapters/telegram/limits.py",
    "adapters/discord/limits.py",
    "adapters/slack/limits.py",
    "adapters/matrix/limits.py",
    "adapters/http/limits.py",
    "adapters/console.py",
}

# Module-level numbers that are codes or identifiers, not limits.
NOT_LIMITS = {
    ("core/settings.py", "EXIT_CONFIG"),
    ("core/settings.py", "EXIT_UNREACHABLE"),
    ("core/capabilities/manager.py", "EXIT_RESTART"),
    ("core/storage/migrations.py", "MIGRATION_LOCK_KEY"),
    ("core/storage/db.py", "DEFAULT_PORT"),
    ("core/accounts/own_data.py", "EXPORT_VERSION"),  # the export file format's version, not a limit
    ("adapters/http/sse.py", "OPENING"),  # the events a stream opens with (ids 0 and 1), not a limit
}


def test_text_at_the_limit_is_kept_whole() -> None:
    """Exactly `limit` characters: returned as it is, in both forms."""
    assert truncate("abcde", 5) == "abcde"
    assert truncate("abcde", 5, one_line=True) == "abcde"


def test_one_over_the_limit_is_cut_with_a_marker_counting_what_was_cut() -> None:
    """One character over: the first `limit` kept, the marker says one more character."""
    assert truncate("abcdef", 5) == "abcde… [truncated, 1 more characters]"


def test_the_marker_counts_every_cut_character() -> None:
    """The count in the marker plus what was kept is the whole text."""
    text = "x" * 12345
    cut = truncate(text, 4000)
    assert cut == "x" * 4000 + "… [truncated, 8345 more characters]"


def test_empty_text_stays_empty() -> None:
    """Nothing to cut."""
    assert truncate("", 5) == ""
    assert truncate("", 5, one_line=True) == ""


def test_one_line_flattens_whitespace_and_ends_in_an_ellipsis_within_the_limit() -> None:
    """The one-line form: whitespace runs become one space; a cut text is `limit` long with the "…"."""
    assert truncate("  a\n\tb  c ", 5, one_line=True) == "a b c"
    assert truncate("abc def", 5, one_line=True) == "abc …"
    assert len(truncate("word " * 100, 90, one_line=True)) == 90
    assert truncate("abc\ndefg", 7, one_line=True) == "abc de…"


def _numeric(node: ast.expr) -> bool:
    """A number, a negated number, a timedelta(...) call, or a tuple of numbers."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _numeric(node.operand)
    if isinstance(node, ast.BinOp):
        return _numeric(node.left) or _numeric(node.right)
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id == "timedelta"
    if isinstance(node, ast.Tuple):
        return bool(node.elts) and all(_numeric(e) for e in node.elts)
    return False


def _numeric_constants(path: Path) -> list[str]:
    """Names of module-level UPPER_CASE assignments of numbers or durations in a file."""
    found = []
    for stmt in ast.parse(path.read_text()).body:
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        for t in targets:
            names = list(t.elts) if isinstance(t, ast.Tuple) else [t]
            values = value.elts if isinstance(t, ast.Tuple) and isinstance(value, ast.Tuple) else [value] * len(names)
            for n, v in zip(names, values, strict=False):
                if isinstance(n, ast.Name) and n.id.lstrip("_").isupper() and _numeric(v):
                    found.append(n.id)
    return found


@pytest.mark.parametrize("package", ["core", "adapters"])
def test_no_limit_is_defined_outside_its_home(package: str) -> None:
    """Every module-level numeric constant in core/ and adapters/ lives in core/constants.py or, for a platform, in
    adapters/<platform>/limits.py (the one-file terminal adapter keeps its own; codes excepted)."""
    stray = [
        f"{rel}: {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        if (rel := path.relative_to(ROOT).as_posix()) not in HOMES
        for name in _numeric_constants(path)
        if (rel, name) not in NOT_LIMITS
    ]
    assert not stray, stray
