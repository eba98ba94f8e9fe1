"""Prometheus metrics of one process, on a registry it owns; labels only take bounded values, never user data."""

from __future__ import annotations

from functools import partial

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.process_collector import ProcessCollector

from core.constants import INBOX_WAIT_BUCKETS, LLM_SECONDS_BUCKETS, REMINDER_LATENESS_BUCKETS, TURN_SECONDS_BUCKETS

TOOL_OUTCOMES = frozenset({"ok", "invalid_args", "unknown_function", "tool_error", "timeout", "forbidden"})
CONTENT_TYPE = CONTENT_TYPE_LATEST  # of exposition()
UNKNOWN_TOOL = "unknown"  # the label of a call to a name the registry does not hold (the model made it up)
OTHER = "other"  # the label of an error code outside TOOL_OUTCOMES


class Metrics:
    """The counters and histograms of one process (a fresh registry unless one is given: tests never collide)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """Register every metric on `registry` (plus the process and GC collectors)."""
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        GCCollector(registry=r)
        counter, gauge = partial(Counter, registry=r), partial(Gauge, registry=r)

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, documentation, registry=r, buckets=buckets)

        self.turns = counter(
            "bot_turns", "Turns by outcome: ok, cut_short, an error code, failed, interrupted", ["outcome"]
        )
        self.turn_seconds = histogram(
            "bot_turn_seconds", "From the message to the final answer of a turn (s)", TURN_SECONDS_BUCKETS
        )
        self.llm_seconds = histogram(
            "bot_llm_request_seconds", "One model request until its whole reply (s)", LLM_SECONDS_BUCKETS
        )
        self.llm_errors = counter(
            "bot_llm_errors", "Failed model requests: timeout, unreachable, refused, malformed", ["kind"]
        )
        self.tool_calls = counter(
            "bot_tool_calls", "Tool calls by tool and outcome (ok or the error code)", ["tool", "outcome"]
        )
        self.reminders_delivered = counter("bot_reminders_delivered", "Reminders the platform accepted")
        self.reminders_late = counter("bot_reminders_late", "Delivered reminders that were late")
        self.reminders_retried = counter("bot_reminders_retried", "Reminder sends that failed and wait for a retry")
        self.reminders_failed = counter("bot_reminders_failed", "Reminders that ended undelivered")
        self.reminder_lateness = histogram(
            "bot_reminder_lateness_seconds", "Delivery time minus due time (s)", REMINDER_LATENESS_BUCKETS
        )
        self.inbox_depth = gauge("bot_inbox_depth", "Updates stored and not yet handled, all processes")
        self.inbox_age = gauge("bot_inbox_oldest_seconds", "Age of the oldest update not yet handled (s)")
        self.inbox_wait = histogram(
            "bot_inbox_wait_seconds", "From storing an update to a process taking it (s)", INBOX_WAIT_BUCKETS
        )
        self.inbox_retaken = counter("bot_inbox_retaken", "Updates taken again (lease ran out or handed back)")
        self.dead_letters = counter(
            "bot_dead_letters", "Updates quarantined as dead letters, by platform and why", ["platform", "stage"]
        )

    def exposition(self) -> bytes:
        """Every metric of this process in the Prometheus text format (CONTENT_TYPE)."""
        return generate_latest(self.registry)

    def turn(self, outcome: str, seconds: float) -> None:
        """Count a finished turn by its outcome, and its duration."""
        self.turns.labels(outcome).inc()
        self.turn_seconds.observe(seconds)

    def tool_call(self, tool: str | None, error_code: str | None) -> None:
        """One tool call; `tool` None when the registry does not hold that name, `error_code` None when ok."""
        outcome = "ok" if error_code is None else error_code if error_code in TOOL_OUTCOMES else OTHER
        self.tool_calls.labels(tool or UNKNOWN_TOOL, outcome).inc()

    def reminder_delivered(self, lateness_s: float, late: bool) -> None:
        """One reminder delivered `lateness_s` after it was due."""
        self.reminders_delivered.inc()
        self.reminder_lateness.observe(max(0.0, lateness_s))
        if late:
            self.reminders_late.inc()
