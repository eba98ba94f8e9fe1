"""Matrix's fixed numbers."""

from __future__ import annotations

# One message part's text, in characters. An event is at most 65,536 bytes of JSON (the spec's PDU limit) and carries
# the text twice (body and formatted_body); 8,000 characters of at most 4 UTF-8 bytes each leave room for both.
MATRIX_TEXT_LIMIT = 8000
MATRIX_MIN_LIMIT = 1000  # a part's least limit: room for the tags a split reopens (markdown-it nests at most 20 deep)
MATRIX_SPLIT_FLOOR = 64  # a part whose plain body is still too long is split smaller, down to this limit at least
MATRIX_LINK_CHARS = 400  # a longer URL is shown as text after its label, not kept in a tag a split cannot cut
MATRIX_UPLOAD_BYTES = 50_000_000  # a common m.upload.size of homeservers (Synapse's default max_upload_size is 50M)
MATRIX_BUTTON_LABEL = 75  # no buttons in Matrix: a reaction's or a line's label at most

# the adapter's own numbers
MATRIX_SYNC_TIMEOUT_MS = 30_000  # one /sync long poll
MATRIX_SYNC_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # waits after failed syncs, the last one repeated
MATRIX_TYPING_MS = 30_000  # one typing notice lasts this long; renewed at half of it while the turn runs
MATRIX_CUT_NOTE_S = 2.0  # sending the "cut short" note at a stop
