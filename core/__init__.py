"""The assistant's core. This is its front door: the only names adapters and bot/ import (`lint-imports` refuses
any other import of a core module from them), listed in docs/architecture.md ("The front door"):

- `Core` (what a front end calls) and `open_core` (how bot/ brings it up), with `Delivery`;
- the types a turn is told in: `Incoming`, `Quoted`, the events, `Step`; reminders' `Outbox`
  protocol with `ReminderMessage` and `DeliveryRefused`; `Settings` and the start-up errors;
- the command catalogue (`COMMANDS`, `Command`, `Option`) and the texts every front end shows the same way.
"""

from core.accounts.api_tokens import Bearer
from core.accounts.own_data import FileAnswer, file_too_large
from core.accounts.web_signin import SIGNIN_PATH
from core.activity import activity_lines, outcome_of, summary_line
from core.agent.providers import config_problem, fix_hint, nothing_configured
from core.api.feed import Feed, progress
from core.api.parts import REPLY, ErrorPart, Part, TextPart, ToolCallPart, ToolResultPart
from core.api.parts import Message as ApiMessage
from core.api.parts import Session as ApiSession
from core.api.service import Api
from core.buttons import CONFIRM_IDS, Allow, Button, Buttons, Confirm, OnTask, Press, ShowSteps, pack, unpack
from core.buttons import Style as ButtonStyle
from core.commands import (
    COMMANDS,
    FORGET_ME_CONFIRM,
    MEMORY_WIPE_CONFIRM,
    MODEL_NOT_YOURS,
    Command,
    CommandArgs,
    CommandName,
    Option,
    TypedCommand,
    app_version,
    typed_command,
)
from core.constants import HTTP_CLOSE_GRACE_S, HTTP_KEEP_ALIVE_S
from core.front_door import Core
from core.inbox import Delivery
from core.mcp_servers.config import environment as mcp_environment
from core.mcp_servers.config import mcp_config_problem
from core.mcp_servers.config import variables as mcp_variables
from core.mcp_servers.oauth import CALLBACK_PATH as MCP_OAUTH_CALLBACK_PATH
from core.media.images import sticker_text
from core.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from core.remind import Reminded
from core.reminders.buttons import UNDO
from core.reminders.engine import DeliveryRefused, Outbox
from core.reminders.messages import ReminderMessage
from core.settings import EXIT_UNREACHABLE, Settings, SettingsError, StartupError, load_settings, redact
from core.startup import open_core
from core.texts import (
    CUT_SHORT,
    EMPTY_ANSWER,
    FAILED,
    FORGET_LABEL,
    HIDE_STEPS,
    NOT_YOUR_BUTTON,
    NOT_YOUR_FORGET,
    NOT_YOUR_PRESS,
    REMINDER_BUTTON_LABELS,
    RESTARTING,
    SENT_PRIVATELY,
    SHOW_STEPS,
    TEXT_ONLY,
    WIPE_LABEL,
)
from core.textsafe import clean_json, strip_nul
from core.timeutil import machine_zone
from core.turn.reply import QuietReply, Reply
from core.types import API as API_PLATFORM
from core.types import (
    Assistant,
    AssistantDelta,
    Error,
    Event,
    Incoming,
    Quoted,
    Spoken,
    Step,
    ToolCall,
    ToolResult,
    Upload,
    UploadKind,
)

__all__ = [
    "API_PLATFORM",
    "COMMANDS",
    "CONFIRM_IDS",
    "CUT_SHORT",
    "EMPTY_ANSWER",
    "EXIT_UNREACHABLE",
    "FAILED",
    "FORGET_LABEL",
    "FORGET_ME_CONFIRM",
    "HIDE_STEPS",
    "HTTP_CLOSE_GRACE_S",
    "HTTP_KEEP_ALIVE_S",
    "MCP_OAUTH_CALLBACK_PATH",
    "MEMORY_WIPE_CONFIRM",
    "METRICS_CONTENT_TYPE",
    "MODEL_NOT_YOURS",
    "NOT_YOUR_BUTTON",
    "NOT_YOUR_FORGET",
    "NOT_YOUR_PRESS",
    "REMINDER_BUTTON_LABELS",
    "REPLY",
    "RESTARTING",
    "SENT_PRIVATELY",
    "SHOW_STEPS",
    "SIGNIN_PATH",
    "TEXT_ONLY",
    "UNDO",
    "WIPE_LABEL",
    "Allow",
    "Api",
    "ApiMessage",
    "ApiSession",
    "Assistant",
    "AssistantDelta",
    "Bearer",
    "Button",
    "ButtonStyle",
    "Buttons",
    "Command",
    "CommandArgs",
    "CommandName",
    "Confirm",
    "Core",
    "Delivery",
    "DeliveryRefused",
    "Error",
    "ErrorPart",
    "Event",
    "Feed",
    "FileAnswer",
    "Incoming",
    "OnTask",
    "Option",
    "Outbox",
    "Part",
    "Press",
    "QuietReply",
    "Quoted",
    "Reminded",
    "ReminderMessage",
    "Reply",
    "Sent",
    "Settings",
    "SettingsError",
    "ShowSteps",
    "Spoken",
    "StartupError",
    "Step",
    "TextPart",
    "ToolCall",
    "ToolCallPart",
    "ToolResult",
    "ToolResultPart",
    "TypedCommand",
    "Upload",
    "UploadKind",
    "activity_lines",
    "app_version",
    "clean_json",
    "config_problem",
    "file_too_large",
    "fix_hint",
    "load_settings",
    "machine_zone",
    "mcp_config_problem",
    "mcp_environment",
    "mcp_variables",
    "nothing_configured",
    "open_core",
    "outcome_of",
    "pack",
    "progress",
    "redact",
    "sticker_text",
    "strip_nul",
    "summary_line",
    "typed_command",
    "unpack",
]
