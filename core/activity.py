"""Platform-neutral text for the tool activity part of a reply."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from core.constants import ACTIVITY_LINES, MEDIA_HEARD_CHARS, OUTCOME_CHARS
from core.quoting import truncate
from core.types import Step


def _short(text: str, limit: int = OUTCOME_CHARS) -> str:
    """One line, cut with an ellipsis."""
    return truncate(text, limit, one_line=True)


def outcome_of(envelope: dict[str, Any]) -> tuple[bool, str, str | None]:
    """(ok, outcome text, error code) taken from a tool result envelope."""
    if envelope.get("ok"):
        result = envelope.get("result")
        if isinstance(result, dict) and isinstance(result.get("summary"), str):
            return True, _short(result["summary"]), None
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
        return True, _short(text or "ok"), None
    error = envelope.get("error") or {}
    code = str(error.get("code", "tool_error"))
    message = error.get("message")
    return False, _short(f"{code}: {message}" if message else code), code


def make_step(name: str, raw_args: str, envelope: dict[str, Any], duration_s: float) -> Step:
    """A Step from a finished call."""
    try:
        parsed = json.loads(raw_args) if raw_args.strip() else {}
    except json.JSONDecodeError:
        parsed = {}
    args = parsed if isinstance(parsed, dict) else {}
    ok, outcome, code = outcome_of(envelope)
    return Step(name=name, arguments=args, ok=ok, outcome=outcome, duration_s=duration_s, error_code=code)


def step_line(step: Step) -> str:
    """`✅ manage_tasks create → #12 "Buy milk", Sat 22 Nov 09:00 CET` or `⚠️ execute_sql → forbidden: …`."""
    action = step.arguments.get("action") or step.arguments.get("mode")
    label = f"{step.name} {action}" if isinstance(action, str) else step.name
    return f"{'✅' if step.ok else '⚠️'} {label} → {step.outcome}"


def summary_line(steps: Sequence[Step], elapsed_s: float) -> str:
    """`🔧 2 steps · 1.3 s`."""
    n = len(steps)
    return f"🔧 {n} step{'s' if n != 1 else ''} · {elapsed_s:.1f} s"


def activity_lines(steps: Sequence[Step]) -> list[str]:
    """One line per tool call, capped; the overflow is counted in a last line."""
    lines = [step_line(s) for s in steps[:ACTIVITY_LINES]]
    if len(steps) > ACTIVITY_LINES:
        lines.append(f"… and {len(steps) - ACTIVITY_LINES} more")
    return lines


def heard_step(transcript: str) -> Step:
    """The step showing what a voice note was heard as (`✅ voice → heard: “…”`): a wrong transcription is visible."""
    heard = truncate(" ".join(transcript.split()), MEDIA_HEARD_CHARS)
    return Step("voice", {}, True, f"heard: “{heard}”", 0.0)
