"""The status board: facts for /status that the adapters and the scheduler report into (Core.status_board)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class StatusBoard:
    """Facts for /status that adapters and the scheduler report into."""

    started_monotonic: float = field(default_factory=time.monotonic)
    adapters: dict[str, str] = field(default_factory=dict)  # name → state
    disconnected: set[str] = field(default_factory=set)  # adapters whose platform connection is down now
    last_poll: dict[str, datetime] = field(default_factory=dict)  # adapter → last successful poll (UTC)
    failed_deliveries: int = 0
    process_id: str | None = None  # this process's id in the fleet while it beats (core/storage/fleet.py)
