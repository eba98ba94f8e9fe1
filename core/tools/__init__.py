"""Tools the model can call: the framework (schemas, envelopes, the registry) and the built-in tools."""

from core.tools.framework import Tool, ToolContext, ToolError, ToolRegistry
from core.tools.sql import EXECUTE_SQL
from core.tools.tasks import MANAGE_TASKS
from core.tools.timezone import SET_TIMEZONE

__all__ = ["EXECUTE_SQL", "MANAGE_TASKS", "SET_TIMEZONE", "Tool", "ToolContext", "ToolError", "ToolRegistry"]
