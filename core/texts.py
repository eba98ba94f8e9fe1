"""What users read that every front end shows the same way: failures, fallbacks, notes and button labels."""

from __future__ import annotations

FAILED = "Sorry, something went wrong on my side. Please try again in a moment."
EMPTY_ANSWER = "(The answer was empty.)"
TEXT_ONLY = "I can't read this kind of message — text, voice notes, photos and documents work (with a caption too)."
SENT_PRIVATELY = "I've sent it to you in a private chat."
CUT_SHORT = "Sorry — I was restarting and had to stop working on that. Please ask again in a minute."
RESTARTING = "I'm restarting right now — please send that again in a minute."  # new work while draining
NO_MODEL = "I have no model to answer messages with here, only commands: e.g. /remind in 10 minutes Tea, /tasks, /help."
NO_MODEL_HOW = " To get answers, set a model: see “Choosing the model” in the README."  # for admins (the terminal)
REMINDER_BUTTON_LABELS = {"done": "✅ Done", "snooze10": "😴 10 min", "snooze60": "😴 1 h", "undo": "↩️ Undo"}
WIPE_LABEL = "🗑 Yes, wipe my memory"
NOT_YOUR_PRESS = "This button is not for you."  # someone else's confirmation or choice (a command without its own)
NOT_YOUR_BUTTON = "This button is not for you: {how} to erase your own memory."  # how: the platform's wipe command
SHOW_STEPS, HIDE_STEPS = "Show steps", "Hide steps"
STEPS_GONE = "I no longer have the steps of that answer (it was deleted)."
STEPS_NOT_YOURS = "Only the person who asked can see the steps of this answer."
FORGET_LABEL = "🗑 Yes, delete everything about me"
NOT_YOUR_FORGET = "This button is not for you: {how} to delete your own data."  # how: the platform's /forget_me
EXPORT_TOO_LARGE = (  # size and limit: e.g. "63.2 MB", "50.0 MB"
    "Your data export is {size}, more than I can send here ({limit} at most). Ask the bot's operator for a copy, "
    "or try /export on another platform you have linked."
)
