"""Reminders: recurrence rules, the engine that claims and delivers due occurrences, its scheduler, and buttons."""

from core.reminders.buttons import BUTTONS, press
from core.reminders.engine import DeliveryRefused, Outbox, ReminderEngine, ReminderMessage, replan_zones
from core.reminders.recurrence import Recurrence
from core.reminders.scheduler import ReminderScheduler

__all__ = [
    "BUTTONS",
    "DeliveryRefused",
    "Outbox",
    "Recurrence",
    "ReminderEngine",
    "ReminderMessage",
    "ReminderScheduler",
    "press",
    "replan_zones",
]
