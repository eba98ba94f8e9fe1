"""Markdown → Telegram renderers compared on a corpus of model-like answers (bench/markdown_corpus.txt, plus long
answers built from it) and on hand-made formatting cases, their scores printed side by side: the hand-written converter
this project had before (read from git history), the markdown-it-py renderer now in adapters/telegram/render.py, and
telegramify-markdown (its plain text and entities written back as HTML so that one validator judges all three). An
answer is accepted when every part passes the fake Bot API's HTML parser (tests.fake_telegram.parse_html), is not
empty after Telegram's trimming and is at most 4,096 UTF-16 units; text kept means every word of the source (link
targets and fence languages aside) is visible, in order; leaked markup, visible non-code text that still shows
Markdown syntax. The goal for the renderer in use: every answer accepted with all its text and no markup left, every
case right. Run with `uv run --with telegramify-markdown python -m bench.markdown_corpus`.
"""

from __future__ import annotations

import html
import importlib
import re
import string
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.telegram.render import render_reply
from tests.fake_telegram import HtmlError, parse_html, utf16_len

LEGACY_COMMIT = "9ccbe2b"  # the last commit with the hand-written converter
CORPUS = Path(__file__).with_name("markdown_corpus.txt")
LIMIT = 4096
SHOWS_SYNTAX = {"unclosed-markers", "escaped-markdown"}  # answers whose right rendering shows `**` or `](`

Entity = dict[str, Any]
Part = tuple[str, list[Entity]]  # visible text and entities, as Telegram would store the message
Render = Callable[[str], list[str]]  # Markdown → HTML parts


def load_corpus() -> list[tuple[str, str]]:
    """(name, answer) pairs from the corpus file, plus a few long answers built from it."""
    items: list[tuple[str, str]] = []
    for chunk in CORPUS.read_text(encoding="utf-8").split("%%% ")[1:]:
        name, _, body = chunk.partition("\n")
        items.append((name.strip(), body.rstrip("\n")))
    everything = "\n\n".join(body for name, body in items if name not in SHOWS_SYNTAX)
    code = "\n".join(f"print('line {i} 😀 <tag> & more')" for i in range(400))
    items += [
        ("long-all-x3", "\n\n".join([everything] * 3)),
        ("long-code", f"Here you go:\n\n```python\n{code}\n```\n\nThe end."),
        ("long-no-spaces", "x" * 3000 + "😀" * 2000 + "y" * 3000),
        ("long-quote-astral", ">\n" + "a" * 4095 + "😀"),
        ("long-bold-lines", "\n".join(f"**Line {i}** with *emphasis* & <angles> 👍🏽" for i in range(400))),
    ]
    return items


# ---------------------------------------------------------------- the renderers


def legacy_renderer() -> Render | None:
    """render_reply of the hand-written converter, loaded from git history (None without git)."""
    try:
        source = subprocess.run(
            ["git", "show", f"{LEGACY_COMMIT}:adapters/telegram_html.py"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    module = types.ModuleType("legacy_telegram_html")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, "legacy_telegram_html.py", "exec"), module.__dict__)
    render: Callable[..., list[str]] = module.render_reply
    return lambda md: render(md, [], 0.0)


def new_renderer(md: str) -> list[str]:
    """render_reply of adapters/telegram/render.py."""
    return render_reply(md, [], 0.0)


_TAGS = {"bold": "b", "italic": "i", "underline": "u", "strikethrough": "s", "spoiler": "tg-spoiler", "code": "code"}


def _start_tag(e: Any) -> tuple[str, str]:
    """HTML start and end tags for a telegramify MessageEntity (empty for auto-detected kinds)."""
    kind = e.type
    if kind in _TAGS:
        return f"<{_TAGS[kind]}>", f"</{_TAGS[kind]}>"
    if kind == "pre":
        lang = f' class="language-{html.escape(e.language, quote=True)}"' if e.language else ""
        return f"<pre><code{lang}>", "</code></pre>"
    if kind == "text_link":
        return f'<a href="{html.escape(e.url or "", quote=True)}">', "</a>"
    if kind in ("blockquote", "expandable_blockquote"):
        return ("<blockquote expandable>" if kind == "expandable_blockquote" else "<blockquote>"), "</blockquote>"
    if kind == "custom_emoji":
        return f'<tg-emoji emoji-id="{e.custom_emoji_id}">', "</tg-emoji>"
    return "", ""


def entities_to_html(text: str, entities: list[Any]) -> str:
    """Plain text + UTF-16 entities → HTML; overlapping entities are closed and reopened around each other."""
    at: list[int] = []  # UTF-16 offset of each character
    pos = 0
    for ch in text:
        at.append(pos)
        pos += utf16_len(ch)
    opens: dict[int, list[Any]] = {}
    for e in sorted(entities, key=lambda e: (e.offset, -e.length)):
        opens.setdefault(e.offset, []).append(e)
    out: list[str] = []
    stack: list[Any] = []

    def close_ending(offset: int) -> None:
        """Close every open entity that ends at offset, reopening the ones it crossed."""
        while any(s.offset + s.length <= offset for s in stack):
            crossed: list[Any] = []
            while stack:
                top = stack.pop()
                out.append(_start_tag(top)[1])
                if top.offset + top.length <= offset:
                    break
                crossed.append(top)
            for again in reversed(crossed):
                out.append(_start_tag(again)[0])
                stack.append(again)

    for i, ch in enumerate(text):
        close_ending(at[i])
        for e in opens.get(at[i], []):
            out.append(_start_tag(e)[0])
            stack.append(e)
        out.append(html.escape(ch, quote=False))
    close_ending(pos)
    return "".join(out)


def telegramify_renderer() -> Render | None:
    """telegramify-markdown's convert + split_entities at 4096, written as HTML (None when not installed)."""
    try:
        tm: Any = importlib.import_module("telegramify_markdown")
    except ImportError:
        return None

    def render(md: str) -> list[str]:
        """Markdown → HTML parts via telegramify-markdown."""
        text, entities = tm.convert(md)
        return [entities_to_html(t, ents) for t, ents in tm.split_entities(text, entities, LIMIT)]

    return render


# ---------------------------------------------------------------- scoring


def telegram_view(part: str) -> Part:
    """What Telegram would store for one HTML part; raises HtmlError/ValueError when it would refuse it."""
    text, entities = parse_html(part)
    if not text.strip(" \t\r\n"):
        raise ValueError("message text is empty")
    if utf16_len(text.strip(" \t\r\n")) > LIMIT:
        raise ValueError("message is too long")
    return text, entities


_REF_LABEL = re.compile(r"\]\[[^\]]*\]")
_LINK_TARGET = re.compile(r"\]\((?:[^()\s]|\([^()\s]*\))*(?:\s+\"[^\"]*\")?\)")
_DEFINITION = re.compile(r"^\s*\[[^\]]+\]:.*$", re.M)
_FENCE_INFO = re.compile(r"^(\s*(?:>\s*)*(?:```+|~~~+))[^\n`]*$", re.M)
_ENTITY_REF = re.compile(r"&(?:#\d+|#x[0-9a-fA-F]+|[a-zA-Z]+);")
_LEAK = re.compile(r"\*\*|~~|\]\(|```|^#{1,6} |^>", re.M)


def source_text(md: str) -> str:
    """The characters a reader must see: the source without link targets, link definitions, fence languages."""
    md = _DEFINITION.sub("", _REF_LABEL.sub("]", _LINK_TARGET.sub("]", md)))
    return _significant(_ENTITY_REF.sub(" ", _FENCE_INFO.sub(r"\1", md)))


def _significant(text: str) -> str:
    """The characters that carry the text: all but whitespace and ASCII punctuation (Markdown's syntax)."""
    return "".join(ch for ch in text if not ch.isspace() and ch not in string.punctuation)


def kept_in_order(wanted: str, visible: str) -> bool:
    """Whether the source's significant characters all appear in the visible text, in order."""
    seen = iter(_significant(visible))
    return all(any(w == v for v in seen) for w in wanted)


def leaks(parts: list[Part]) -> bool:
    """Whether visible text outside code shows Markdown syntax."""
    for text, entities in parts:
        units = list(text)
        starts = [0]
        for ch in text:
            starts.append(starts[-1] + utf16_len(ch))
        code = [(e["offset"], e["offset"] + e["length"]) for e in entities if e["type"] in ("code", "pre")]
        plain = "".join(c for c, s in zip(units, starts, strict=False) if not any(a <= s < b for a, b in code))
        if _LEAK.search(plain):
            return True
    return False


@dataclass
class Case:
    """A formatting case: Markdown and the checks its rendering must pass."""

    name: str
    md: str
    entities: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)  # (type, covered text, extras)
    contains: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    no_entities: tuple[str, ...] = ()
    check: Callable[[list[Part]], bool] | None = None


def _covered(part: Part, e: Entity) -> str:
    """The text an entity covers."""
    data = part[0].encode("utf-16-le", "surrogatepass")
    return data[2 * e["offset"] : 2 * (e["offset"] + e["length"])].decode("utf-16-le", "surrogatepass")


def passes(case: Case, parts: list[Part]) -> bool:
    """Whether the rendered parts satisfy every check of a case."""
    visible = "\n".join(t for t, _ in parts)
    for kind, text, extras in case.entities:
        if not any(
            e["type"] == kind and _covered(p, e).strip() == text and all(e.get(k) == v for k, v in extras.items())
            for p in parts
            for e in p[1]
        ):
            return False
    if any(s not in visible for s in case.contains) or any(s in visible for s in case.absent):
        return False
    if any(e["type"] in case.no_entities for _, ents in parts for e in ents):
        return False
    return case.check is None or case.check(parts)


def _indent_of(line_text: str, parts: list[Part]) -> int:
    """Indentation of the first visible line ending with line_text (-1 when absent)."""
    for line in "\n".join(t for t, _ in parts).split("\n"):
        if line.rstrip().endswith(line_text):
            return len(line) - len(line.lstrip())
    return -1


_WIKI = "https://en.wikipedia.org/wiki/Foo_(bar)"
_LONG_CODE = "```python\n" + "\n".join(f"x_{i} = {i}  # 😀" for i in range(600)) + "\n```"
CASES = [
    Case("bold+italic ***x***", "***x***", [("bold", "x", {}), ("italic", "x", {})], absent=["*"]),
    Case("link with parentheses", f"[x]({_WIKI})", [("text_link", "x", {"url": _WIKI})], absent=["]("]),
    Case(
        "link, nested parens+_",
        "[y](https://e.com/a_b_(c)_d)",
        [("text_link", "y", {"url": "https://e.com/a_b_(c)_d"})],
    ),
    Case("multi-line bold", "**a\nb**", [("bold", "a\nb", {})], absent=["*"]),
    Case("multi-line italic", "*a\nb*", [("italic", "a\nb", {})], absent=["*"]),
    Case("underscore bold/italic", "__a__ and _b_", [("bold", "a", {}), ("italic", "b", {})], absent=["_"]),
    Case("bold inside italic", "*it **bo** it*", [("bold", "bo", {}), ("italic", "it bo it", {})]),
    Case("strikethrough", "~~gone~~ here", [("strikethrough", "gone", {})], absent=["~"]),
    Case("inline code with backtick", "``a ` b``", [("code", "a ` b", {})]),
    Case("inline code keeps markup", "Use `x = **y** <z> &`", [("code", "x = **y** <z> &", {})]),
    Case("fence with language", "```python\nprint(1)\n```", [("pre", "print(1)", {"language": "python"})]),
    Case("tilde fence", "~~~bash\nls -la\n~~~", [("pre", "ls -la", {"language": "bash"})]),
    Case("fence keeps <tags> &", "```\n<b>x</b> & y\n```", [("pre", "<b>x</b> & y", {})], no_entities=("bold",)),
    Case("blockquote", "> quoted words", [("blockquote", "quoted words", {})], absent=[">"]),
    Case("nested quote accepted", "> a\n>> b", contains=["a", "b"], absent=[">"]),
    Case("heading as bold", "# Title\nbody", [("bold", "Title", {})], absent=["#"]),
    Case("setext heading", "Title\n=====", [("bold", "Title", {})], absent=["="]),
    Case("literal HTML stays text", "a <b>x</b> & <br> c", contains=["a <b>x</b> & <br> c"], no_entities=("bold",)),
    Case("ampersands", "Tom & Jerry, AT&T &amp; co", contains=["Tom & Jerry, AT&T & co"]),
    Case("angle brackets", "Vec<String> and 5 < 6 > 4", contains=["Vec<String> and 5 < 6 > 4"]),
    Case(
        "snake_case not italic",
        "my_var_name and snake_case",
        contains=["my_var_name and snake_case"],
        no_entities=("italic",),
    ),
    Case("escaped stars", r"\*not italic\*", contains=["*not italic*"], no_entities=("italic",)),
    Case("bullets", "- a\n- b", contains=["a\n", "b"], absent=["- "]),
    Case("nested bullets indented", "- a\n  - b", check=lambda p: _indent_of("b", p) > _indent_of("a", p) >= 0),
    Case("ordered list", "1. one\n2. two", contains=["1. one", "2. two"]),
    Case("ordered from 7", "7. seven\n8. eight", contains=["7. seven", "8. eight"]),
    Case("bold link", "**[bl](https://c.d)**", [("bold", "bl", {}), ("text_link", "bl", {"url": "https://c.d"})]),
    Case("autolink", "<https://pypi.org/>", contains=["https://pypi.org/"], absent=["<"]),
    Case(
        "image → link",
        "![chart](https://x.io/c.png)",
        contains=["chart"],
        check=lambda p: any(e.get("url") == "https://x.io/c.png" for _, es in p for e in es),
    ),
    Case("table readable", "| a | b |\n|---|---|\n| 1 | **2** |", contains=["a", "b", "1", "2"], absent=["|---", "**"]),
    Case("hard break", "one  \ntwo", contains=["one\ntwo"]),
    Case("soft break kept", "one\ntwo", contains=["one\ntwo"]),
    Case("emoji in bold", "**😀 done** ok", [("bold", "😀 done", {})]),
    Case("CJK bold", "**买牛奶** 好", [("bold", "买牛奶", {})]),
    Case("reference link", "[g][r]\n\n[r]: https://e.com/g", [("text_link", "g", {"url": "https://e.com/g"})]),
    Case("empty code block sends something", "```\n```", check=lambda p: len(p) >= 1),
    Case("only a quote marker", ">", check=lambda p: len(p) >= 1),
    Case(
        "long code keeps language",
        _LONG_CODE,
        check=lambda p: (
            len(p) >= 2 and all(any(e["type"] == "pre" and e.get("language") == "python" for e in es) for _, es in p)
        ),
    ),
    Case("spoiler", "It is ||42|| — a || b", [("spoiler", "42", {})], contains=["a || b"], absent=["||4"]),
    Case("4097 units split", ">\n" + "a" * 4095 + "😀", contains=["😀"]),
]


# ---------------------------------------------------------------- main


@dataclass
class Score:
    """One renderer's results."""

    accepted: int = 0
    kept: int = 0
    clean: int = 0
    cases: int = 0
    failed_cases: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)
    seconds: float = 0.0


def view(render: Render, md: str) -> list[Part] | str:
    """Telegram's view of each part, or the first refusal as a string."""
    try:
        parts = render(md)
    except Exception as e:  # a renderer that crashes loses the answer
        return f"crash: {type(e).__name__}: {e}"
    if not parts:
        return "no part at all"
    try:
        return [telegram_view(p) for p in parts]
    except (HtmlError, ValueError) as e:
        return str(e)


def score(render: Render, corpus: list[tuple[str, str]]) -> Score:
    """Run one renderer over the corpus and the cases."""
    s = Score()
    start = time.perf_counter()
    for _, md in corpus:
        try:
            render(md)
        except Exception:  # counted below as a refusal
            pass
    s.seconds = time.perf_counter() - start
    for name, md in corpus:
        got = view(render, md)
        if isinstance(got, str):
            s.rejected.append(f"{name} ({got[:60]})")
            continue
        s.accepted += 1
        if kept_in_order(source_text(md), "\n".join(t for t, _ in got)):
            s.kept += 1
        else:
            s.lost.append(name)
        if leaks(got) and name not in SHOWS_SYNTAX:
            s.leaked.append(name)
        else:
            s.clean += 1
    for case in CASES:
        got = view(render, case.md)
        if not isinstance(got, str) and passes(case, got):
            s.cases += 1
        else:
            s.failed_cases.append(case.name)
    return s


def main() -> None:
    """Print the scores of every available renderer side by side."""
    corpus = load_corpus()
    renderers: dict[str, Render | None] = {
        "hand-written (old)": legacy_renderer(),
        "markdown-it-py (new)": new_renderer,
        "telegramify-markdown": telegramify_renderer(),
    }
    scores = {name: score(r, corpus) for name, r in renderers.items() if r is not None}
    missing = [name for name, r in renderers.items() if r is None]
    n, c = len(corpus), len(CASES)
    rows: list[tuple[str, Callable[[Score], str]]] = [
        (f"accepted by the Bot API parser (of {n})", lambda s: str(s.accepted)),
        (f"all text kept, in order (of {n})", lambda s: str(s.kept)),
        (f"no Markdown syntax left visible (of {n})", lambda s: str(s.clean)),
        (f"formatting cases right (of {c})", lambda s: str(s.cases)),
        ("time to render the corpus", lambda s: f"{s.seconds * 1000:.0f} ms"),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"{'':{width}}  " + "  ".join(f"{name:>22}" for name in scores))
    for label, cell in rows:
        print(f"{label:{width}}  " + "  ".join(f"{cell(s):>22}" for s in scores.values()))
    for name, s in scores.items():
        print(f"\n{name}:")
        print("  rejected:     " + ("; ".join(s.rejected) or "—"))
        print("  text lost:    " + (", ".join(s.lost) or "—"))
        print("  markup shown: " + (", ".join(s.leaked) or "—"))
        print("  cases failed: " + (", ".join(s.failed_cases) or "—"))
    for name in missing:
        hint = "uv run --with telegramify-markdown python -m bench.markdown_corpus" if "telegramify" in name else "git"
        print(f"\n{name}: not available here ({hint})", file=sys.stderr)


if __name__ == "__main__":
    main()
