"""The agent: the model loop, the LLM client and its providers, the system prompt, and history replay."""

from core.agent.llm import LLM, LLMReply, LLMTimeout, LLMUnavailable
from core.agent.loop import Limits, run_agent
from core.agent.prompt import system_prompt
from core.agent.providers import HOW_TO_CONFIGURE, PROVIDERS, config_problem
from core.agent.replay import build_replay

__all__ = [
    "HOW_TO_CONFIGURE",
    "LLM",
    "PROVIDERS",
    "LLMReply",
    "LLMTimeout",
    "LLMUnavailable",
    "Limits",
    "build_replay",
    "config_problem",
    "run_agent",
    "system_prompt",
]
