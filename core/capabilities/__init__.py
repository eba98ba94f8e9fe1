"""Capabilities, the tools the agent writes itself: their versioned store, checks, runtime and managing tools."""

from core.capabilities.manager import MATERIALISED_DIR, CapabilityManager

__all__ = ["MATERIALISED_DIR", "CapabilityManager"]
