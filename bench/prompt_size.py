"""How large is the request the bot sends the model for a "hi"? A real Core (ADMINS naming the speaker, every built-in
tool registered as core/front_door.py's Core does, settings at their defaults) answers "hi" from an admin and from a
plain allowed user, in a private chat and in a group, through a fake OpenAI-compatible server (tests.fake_openai) that
keeps each request; this prints the tools offered, the characters of the system prompt, the tool schemas and the
messages, and their tokens in the o200k_base encoding (goal: an admin's "hi" in a private chat < 2,000 tokens).

Tokens: the tokens of each message's content plus those of the tool schemas as the API receives them (the request's
`tools` list serialised as the openai SDK sends a body: json.dumps with separators "," and ":", ensure_ascii off): an
upper bound of what the server counts for the schemas (it renders them in its own, terser form); json.dumps's default
form (a space after each , and :) is shown too, and the chat format's per-message overhead (3 tokens a message, plus 3
priming the answer) apart. Counted with
tiktoken if it loads o200k_base, else with node and the npm package gpt-tokenizer (v4, which bundles o200k_base:
`npm install gpt-tokenizer` in some DIR, then NODE_PATH=DIR/node_modules or --node-modules DIR/node_modules), else
estimated as characters / 4 (labelled as such).
PostgreSQL: DATABASE_URL (a scratch database on it) or an embedded server in a temp dir.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's packages first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import asyncio
import importlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.common import bench_core, bench_database, parser, quiet_logging
from core.types import Assistant, Error, Incoming
from tests.fake_openai import FakeOpenAI, Reply

GOAL_TOKENS = 2_000
PER_MESSAGE, PRIMING = 3, 3  # the chat format's tokens around each message, and before the answer
PLATFORM = "telegram"

# Counts the o200k_base tokens of each text of a JSON list on stdin; prints a JSON list of counts.
_NODE_COUNT = """
const {encode} = require('gpt-tokenizer/encoding/o200k_base');
let data = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (c) => { data += c; });
process.stdin.on('end', () => {
  process.stdout.write(JSON.stringify(JSON.parse(data).map((t) => encode(t).length)));
});
"""


# ---------------------------------------------------------------- the tokenizer


@dataclass(frozen=True)
class Tokenizer:
    """Counts the tokens of many texts at once; `exact` False: an estimate."""

    name: str
    exact: bool
    count: Callable[[Sequence[str]], list[int]]


def _tiktoken() -> Tokenizer | None:
    """tiktoken's o200k_base, if the package is installed and its encoding file can be loaded."""
    try:
        enc = importlib.import_module("tiktoken").get_encoding("o200k_base")
    except Exception as e:  # not installed, or the encoding file could not be fetched
        print(f"(tiktoken o200k_base not available: {type(e).__name__}: {str(e)[:120]})")
        return None
    return Tokenizer(
        "tiktoken o200k_base", True, lambda texts: [len(enc.encode(t, disallowed_special=())) for t in texts]
    )


def _node(node_modules: str | None) -> Tokenizer | None:
    """node with the npm package gpt-tokenizer's o200k_base (found through NODE_PATH or `node_modules`)."""
    node = shutil.which("node")
    if node is None:
        print("(node not on PATH: no gpt-tokenizer)")
        return None
    env = dict(os.environ)
    if node_modules:
        env["NODE_PATH"] = os.pathsep.join(filter(None, [str(Path(node_modules).resolve()), env.get("NODE_PATH")]))

    def count(texts: Sequence[str]) -> list[int]:
        done = subprocess.run(
            [node, "-e", _NODE_COUNT],
            input=json.dumps(list(texts)),
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        counts = json.loads(done.stdout)
        if not isinstance(counts, list) or len(counts) != len(texts):
            raise ValueError(f"node answered {done.stdout[:80]!r}")
        return [int(n) for n in counts]

    try:
        if count(["hello world"]) != [2]:
            raise ValueError("'hello world' is not 2 tokens")
    except (OSError, subprocess.CalledProcessError, ValueError) as e:
        lines = e.stderr.strip().splitlines() if isinstance(e, subprocess.CalledProcessError) else [str(e)]
        said = next((ln for ln in lines if "Error" in ln), lines[0] if lines else type(e).__name__)
        print(f"(node + gpt-tokenizer not available: {said.strip()[:160]})")
        return None
    version = ""
    probe = "process.stdout.write(require('gpt-tokenizer/package.json').version)"
    try:
        version = " " + subprocess.run([node, "-e", probe], capture_output=True, text=True, env=env).stdout.strip()
    except OSError:
        pass
    return Tokenizer(f"gpt-tokenizer{version} o200k_base (node)", True, count)


def _estimate() -> Tokenizer:
    """Characters / 4, the usual rule of thumb for English."""
    return Tokenizer(
        "ESTIMATE: characters / 4 (no o200k_base tokenizer)", False, lambda ts: [-(-len(t) // 4) for t in ts]
    )


def tokenizer(choice: str, node_modules: str | None) -> Tokenizer:
    """The first of tiktoken, node + gpt-tokenizer and the estimate that works (or the one chosen)."""
    if choice in ("auto", "tiktoken") and (tok := _tiktoken()) is not None:
        return tok
    if choice in ("auto", "node") and (tok := _node(node_modules)) is not None:
        return tok
    if choice != "estimate":
        print("NO o200k_base TOKENIZER AVAILABLE: token figures below are ESTIMATES (characters / 4)")
    return _estimate()


# ---------------------------------------------------------------- one request measured


def content_text(content: Any) -> str:
    """A message's content as text (the text parts of a list of parts)."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


@dataclass(frozen=True)
class Measured:
    """The figures of one recorded request."""

    label: str
    tool_names: list[str]
    system_chars: int
    system_tokens: int
    tools_chars: int
    tools_tokens: int  # as sent: json.dumps(tools, ensure_ascii=False, separators=(",", ":"))
    spaced_tokens: int  # json.dumps(tools) with its default separators ", " and ": "
    other_chars: int  # the messages after the system prompt
    other_tokens: int
    messages: int
    sections: list[tuple[int, str]]  # (tokens, first words) of each line of the system prompt
    per_tool: list[tuple[int, int, str]]  # (tokens, characters, name) of each tool's schema

    @property
    def total(self) -> int:
        """Tokens of the contents and the schemas."""
        return self.system_tokens + self.tools_tokens + self.other_tokens

    @property
    def overhead(self) -> int:
        """The chat format's tokens around the messages."""
        return PER_MESSAGE * self.messages + PRIMING


def wire_json(value: Any) -> str:
    """JSON as the openai SDK (and httpx) put it in a request body."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def measure(label: str, body: dict[str, Any], tok: Tokenizer) -> Measured:
    """Count one request body as the fake model received it."""
    messages: list[dict[str, Any]] = body.get("messages", [])
    tools: list[dict[str, Any]] = body.get("tools", [])
    system = "\n".join(content_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer"))
    others = [content_text(m.get("content")) for m in messages if m.get("role") not in ("system", "developer")]
    schemas = wire_json(tools) if tools else ""
    lines = system.split("\n")
    each = [wire_json(t) for t in tools]
    spaced = json.dumps(tools) if tools else ""
    counts = tok.count([system, schemas, spaced, *others, *lines, *each])
    sys_t, tools_t, spaced_t, rest = counts[0], counts[1], counts[2], counts[3:]
    other_t, rest = rest[: len(others)], rest[len(others) :]
    line_t, tool_t = rest[: len(lines)], rest[len(lines) :]
    names = [str(t.get("function", {}).get("name", "?")) for t in tools]
    return Measured(
        label,
        names,
        len(system),
        sys_t,
        len(schemas),
        tools_t,
        spaced_t,
        sum(map(len, others)),
        sum(other_t),
        len(messages),
        [(n, line[:70] + ("…" if len(line) > 70 else "")) for n, line in zip(line_t, lines, strict=True)],
        sorted(((n, len(s), name) for n, s, name in zip(tool_t, each, names, strict=True)), reverse=True),
    )


def print_measured(m: Measured, tok: Tokenizer, *, detail: bool) -> None:
    """The figures of one request; with `detail` the system prompt's lines and each tool's schema."""
    unit = "tokens" if tok.exact else "tokens (ESTIMATE)"
    print(f"== {m.label} ==")
    print(f"  {len(m.tool_names)} tools: {', '.join(m.tool_names) or '(none)'}")
    print(f"  system prompt  {m.system_chars:7,} chars  {m.system_tokens:6,} {unit}")
    print(
        f"  tool schemas   {m.tools_chars:7,} chars  {m.tools_tokens:6,} {unit}   (`tools` as sent; "
        f"{m.spaced_tokens:,} as json.dumps's default form)"
    )
    print(
        f"  other messages {m.other_chars:7,} chars  {m.other_tokens:6,} {unit}   ({m.messages - 1} after the system)"
    )
    print(f"  total          {m.system_chars + m.tools_chars + m.other_chars:7,} chars  {m.total:6,} {unit}")
    print(
        f"  + chat format overhead ({PER_MESSAGE} per message × {m.messages} + {PRIMING}): {m.overhead} → "
        f"{m.total + m.overhead:,} {unit}"
    )
    if detail:
        print("  system prompt by line (tokens, start):")
        for n, start in m.sections:
            print(f"    {n:5,}  {start}")
        print("  tool schemas, largest first (tokens, chars, name):")
        for n, chars, name in m.per_tool:
            print(f"    {n:5,}  {chars:6,}  {name}")
    print()


# ---------------------------------------------------------------- the run


SPEAKERS = {"admin": "admin-1", "user": "user-1"}


async def bench(args: argparse.Namespace, tok: Tokenizer) -> int:
    """Say "hi" as an admin and as a plain user, privately and in a group; print what each request held."""
    status = 0
    async with bench_database() as db, FakeOpenAI(default=Reply(text="Hello!")) as fake:
        tag = db.tag
        settings = {
            "ADMINS": f"{PLATFORM}:{tag}{SPEAKERS['admin']}",
            "ALLOWED_USERS": f"{PLATFORM}:{tag}{SPEAKERS['user']}",
        }
        print(f"tokenizer: {tok.name}")
        print(
            "count: tokens of each message's content + tokens of the `tools` list as the openai SDK sends it "
            '(json.dumps, separators "," and ":"; an upper bound of what the server counts); the chat format\'s '
            f"overhead ({PER_MESSAGE} tokens a message + {PRIMING}) shown apart"
        )
        print()
        async with bench_core(db.dsn, fake.base_url, settings=settings) as core:
            cases = [
                ("admin", "private", "an admin's hi in a private chat"),
                ("user", "private", "a plain allowed user's hi in a private chat"),
                ("admin", "group", "an admin's hi in a group"),
                ("user", "group", "a plain allowed user's hi in a group"),
            ]
            headline: Measured | None = None
            for who, kind, label in cases:
                uid = f"{tag}{SPEAKERS[who]}"
                chat = f"{tag}{kind}-{who}"
                inc = Incoming(
                    PLATFORM,
                    uid,
                    chat if kind == "group" else uid,
                    "hi",
                    user_name=f"Bench {who.title()}",
                    chat_kind="group" if kind == "group" else "private",
                    chat_title="bench group" if kind == "group" else "",
                    message_id=f"{tag}{who}-{kind}",
                )
                before = len(fake.requests)
                last: Assistant | Error | None = None
                async for event in core.handle(inc):
                    if isinstance(event, Assistant | Error):
                        last = event
                if not isinstance(last, Assistant) or len(fake.requests) <= before:
                    print(f"== {label}: no answer ({last!r}) ==")
                    status = 1
                    continue
                m = measure(label, fake.requests[before], tok)
                print_measured(m, tok, detail=args.detail or (who, kind) == ("admin", "private"))
                if (who, kind) == ("admin", "private"):
                    headline = m
    if headline is not None:
        ok = headline.total < GOAL_TOKENS
        est = "" if tok.exact else " (ESTIMATE)"
        print(
            f"[HEADLINE] whole request for an admin's hi in a private chat: {headline.total:,} tokens{est}   "
            f"goal < {GOAL_TOKENS:,}   {'ok' if ok else 'MISSED'}"
        )
        spaced = headline.total - headline.tools_tokens + headline.spaced_tokens
        print(
            f"  ({headline.total + headline.overhead:,} with the chat format's overhead; {spaced:,} with the schemas "
            f"in json.dumps's default form, {'under' if spaced < GOAL_TOKENS else 'OVER'} the goal; tokenizer: "
            f"{tok.name})"
        )
        status |= int(not ok)
    return status


def main(argv: list[str] | None = None) -> int:
    """Parse the options and run; the exit status is 1 when the goal is missed."""
    p = parser("prompt_size", __doc__)
    p.add_argument(
        "--node-modules", metavar="DIR", help="a node_modules folder holding gpt-tokenizer (else NODE_PATH is used)"
    )
    p.add_argument(
        "--tokenizer",
        choices=("auto", "tiktoken", "node", "estimate"),
        default="auto",
        help="how to count (auto: tiktoken, else node + gpt-tokenizer, else characters / 4)",
    )
    p.add_argument("--detail", action="store_true", help="the system prompt's lines and each schema for every case")
    args = p.parse_args(argv)
    quiet_logging()
    tok = tokenizer(args.tokenizer, args.node_modules)
    return asyncio.run(bench(args, tok))


if __name__ == "__main__":
    sys.exit(main())
