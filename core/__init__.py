"""The assistant's core; this is its front door: what adapters and bot/ may use."""

from core.activity import activity_lines, summary_line
from core.agent.providers import HOW_TO_CONFIGURE, config_problem
from core.commands import COMMANDS, HELP, MEMORY_WIPE_CONFIRM, Command, CommandArgs, CommandName, Option, StatusBoard
from core.front_door import Core
from core.inbox import Delivery
from core.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from core.reminders.buttons import BUTTONS
from core.reminders.engine import DeliveryRefused, Outbox
from core.reminders.messages import ReminderMessage
from core.settings import EXIT_CONFIG, EXIT_UNREACHABLE, Settings, SettingsError, StartupError, load_settings, redact
from core.startup import open_core
from core.texts import (
    CUT_SHORT,
    EMPTY_ANSWER,
    FAILED,
    HIDE_STEPS,
    NOT_YOUR_BUTTON,
    REMINDER_BUTTON_LABELS,
    RESTARTING,
    SENT_PRIVATELY,
    SHOW_STEPS,
    TEXT_ONLY,
    WIPE_LABEL,
)
from core.types import Assistant, AssistantDelta, ChatKind, Error, Event, Incoming, Quoted, Step, TurnSteps

__all__ = [
    "BUTTONS",
    "COMMANDS",
    "CUT_SHORT",
    "EMPTY_ANSWER",
    "EXIT_CONFIG",
    "EXIT_UNREACHABLE",
    "FAILED",
    "HELP",
    "HIDE_STEPS",
    "HOW_TO_CONFIGURE",
    "MEMORY_WIPE_CONFIRM",
    "METRICS_CONTENT_TYPE",
    "NOT_YOUR_BUTTON",
    "REMINDER_BUTTON_LABELS",
    "RESTARTING",
    "SENT_PRIVATELY",
    "SHOW_STEPS",
    "TEXT_ONLY",
    "WIPE_LABEL",
    "Assistant",
    "AssistantDelta",
    "ChatKind",
    "Command",
    "CommandArgs",
    "CommandName",
    "Core",
    "Delivery",
    "DeliveryRefused",
    "Error",
    "Event",
    "Incoming",
    "Option",
    "Outbox",
    "Quoted",
    "ReminderMessage",
    "Settings",
    "SettingsError",
    "StartupError",
    "StatusBoard",
    "Step",
    "TurnSteps",
    "activity_lines",
    "config_problem",
    "load_settings",
    "open_core",
    "redact",
    "summary_line",
]
