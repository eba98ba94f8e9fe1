"""The commands the bot answers without the model: each declared once (core/commands/base.py: name, options,
parser, handler) beside its handler in a module of its subject; catalogue.py orders them for every front end."""

from core.commands.account import FORGET_ME_CONFIRM
from core.commands.base import Answer, Ask, Command, CommandArgs, CommandName, CoreParts, Option
from core.commands.board import StatusBoard
from core.commands.catalogue import (
    COMMAND,
    COMMANDS,
    HELP,
    HELP_NO_MODEL,
    RESET_DONE,
    UNKNOWN_COMMAND,
    TypedCommand,
    typed_command,
)
from core.commands.memory import MEMORY_WIPE_CONFIRM
from core.commands.model import MODEL_NOT_YOURS, model_token
from core.commands.status import app_version, status_text

__all__ = [
    "COMMAND",
    "COMMANDS",
    "FORGET_ME_CONFIRM",
    "HELP",
    "HELP_NO_MODEL",
    "MEMORY_WIPE_CONFIRM",
    "MODEL_NOT_YOURS",
    "RESET_DONE",
    "UNKNOWN_COMMAND",
    "Answer",
    "Ask",
    "Command",
    "CommandArgs",
    "CommandName",
    "CoreParts",
    "Option",
    "StatusBoard",
    "TypedCommand",
    "app_version",
    "model_token",
    "status_text",
    "typed_command",
]
