"""Reminders: recurrence rules, the engine that claims and delivers due occurrences, its SQL (queries), its texts
(messages), its scheduler, and buttons."""
