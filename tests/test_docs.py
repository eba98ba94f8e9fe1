"""The README and docs/: every relative link leads to a file and every #anchor to one of its headings (GitHub's
slugs), the README stays a user's document of about 250 lines, and its settings table lists every setting with
its default."""

from __future__ import annotations

import re
from pathlib import Path

from core.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINKED_FILES = [README, *DOCS, ROOT / "capabilities" / "README.md"]
README_MAX_LINES = 279  # issue 32: under 280 lines a user reads; the detail lives in docs/

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # https:, mailto:, …
NOT_IN_SLUG = re.compile(r"[^\w\- ]")  # GitHub keeps letters, digits, _, - and spaces (then spaces become -)
SETTING = re.compile(r"`([A-Z][A-Z0-9_]+)`")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (links and headings there are not links and headings)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its visible text (code spans and links unwrapped), lower case, punctuation
    dropped, each space a hyphen."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = LINK.sub(lambda m: m.group(1), text)
    return NOT_IN_SLUG.sub("", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a file's headings get (a repeated heading gets -1, -2, … as on GitHub)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if m is None:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    """The targets of a file's Markdown links and images, outside code blocks and code spans."""
    found: list[str] = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        found += [m.group(2) for m in LINK.finditer(CODE_SPAN.sub("", line))]
    return found


def broken_links(path: Path) -> list[str]:
    """`file: target (why)` for each relative link of `path` whose file or heading does not exist."""
    problems: list[str] = []
    for target in links(path):
        if not target or EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}: {target}"
        if not dest.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and (dest.is_dir() or dest.suffix != ".md"):
            problems.append(f"{where} (an anchor into something that is not a Markdown file)")
        elif anchor and anchor not in anchors(dest):
            problems.append(f"{where} (no such heading in {dest.relative_to(ROOT)})")
    return problems


def settings_table(path: Path) -> dict[str, str]:
    """The README's settings table (its `## Settings` section): each variable named in a row's first cell → that
    row's last cell (the default)."""
    rows: dict[str, str] = {}
    inside = False
    for line in prose_lines(path.read_text(encoding="utf-8")):
        heading = HEADING.match(line)
        if heading is not None:
            inside = heading.group(2).strip() == "Settings"
            continue
        if inside and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            for name in SETTING.findall(cells[0]):
                rows[name] = cells[-1]
    return rows


def shown_default(value: object) -> str | None:
    """How a setting's default is written in the table (None: unset or empty, written in words)."""
    if value is None or value == "":
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def test_every_relative_link_and_anchor_resolves() -> None:
    problems = [p for path in LINKED_FILES for p in broken_links(path)]
    assert problems == []


def test_every_document_in_docs_is_linked_from_the_readme() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README) if not EXTERNAL.match(t)}
    assert DOCS, "docs/ holds the maintainers' material"
    assert [d.name for d in DOCS if d.resolve() not in linked] == []


def test_the_readme_stays_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


def test_the_settings_table_lists_every_setting_with_its_default() -> None:
    table = settings_table(README)
    assert sorted(set(Settings.model_fields) - set(table)) == [], "settings missing from the README's table"
    assert sorted(set(table) - set(Settings.model_fields)) == [], "the README's table names settings that do not exist"
    wrong = {
        name: (table[name], default)
        for name, field in Settings.model_fields.items()
        if (default := shown_default(field.default)) is not None and f"`{default}`" not in table[name]
    }
    assert wrong == {}, "the README's default differs from core/settings.py"


def test_slugs_follow_github() -> None:
    assert slug("Who can do what (threat model)") == "who-can-do-what-threat-model"
    assert slug("Who may read /metrics") == "who-may-read-metrics"
    assert slug("The `/memory` command") == "the-memory-command"
    assert slug("Capabilities: tools the assistant writes itself") == "capabilities-tools-the-assistant-writes-itself"
    assert slug("One Telegram message, in 12 stops") == "one-telegram-message-in-12-stops"
    assert slug("An external database (`DATABASE_URL`)") == "an-external-database-database_url"
