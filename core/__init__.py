"""The assistant's core; this is its front door: what adapters and bot/ may use."""

from core.activity import activity_lines, summary_line
from core.agent.providers import HOW_TO_CONFIGURE
from core.commands import COMMANDS, HELP, MEMORY_WIPE_CONFIRM, Command, CommandArgs, CommandName, Option, StatusBoard
from core.front_door import Core
from core.reminders.buttons import BUTTONS
from core.reminders.engine import DeliveryRefused, Outbox, ReminderMessage
from core.settings import EXIT_CONFIG, EXIT_UNREACHABLE, Settings, StartupError
from core.storage.conversations import TurnSteps
from core.storage.inbox_table import InboxItem
from core.types import RESTARTING, Assistant, AssistantDelta, ChatKind, Error, Event, Incoming, Quoted, Step

__all__ = [
    "BUTTONS",
    "COMMANDS",
    "EXIT_CONFIG",
    "EXIT_UNREACHABLE",
    "HELP",
    "HOW_TO_CONFIGURE",
    "MEMORY_WIPE_CONFIRM",
    "RESTARTING",
    "Assistant",
    "AssistantDelta",
    "ChatKind",
    "Command",
    "CommandArgs",
    "CommandName",
    "Core",
    "DeliveryRefused",
    "Error",
    "Event",
    "InboxItem",
    "Incoming",
    "Option",
    "Outbox",
    "Quoted",
    "ReminderMessage",
    "Settings",
    "StartupError",
    "StatusBoard",
    "Step",
    "TurnSteps",
    "activity_lines",
    "summary_line",
]
