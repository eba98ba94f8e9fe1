"""Reminders: recurrence rules, the engine that claims and delivers due occurrences, its scheduler, and buttons."""
