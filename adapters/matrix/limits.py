"""Matrix's fixed numbers."""

from __future__ import annotations

# One message part's text, in characters. An event is at most 65,536 bytes of JSON (the spec's PDU limit) and carries
# the text twice: body (up to 4 UTF-8 bytes a character, 6 JSON-escaped) and formatted_body (an escape like &quot; is 6
# bytes, wrapped in tags); 4,000 characters leave room for both and for the steps under the last part, and read well
# on a phone.
MATRIX_TEXT_LIMIT = 4000
MATRIX_MIN_LIMIT = 1000  # a part's least limit: room for the tags a split reopens (markdown-it nests at most 20 deep)
MATRIX_SPLIT_FLOOR = 64  # a part whose plain body is still too long is split smaller, down to this limit at least
MATRIX_LINK_CHARS = 400  # a longer URL is shown as text after its label, not kept in a tag a split cannot cut
MATRIX_UPLOAD_BYTES = 50_000_000  # a common m.upload.size of homeservers (Synapse's default max_upload_size is 50M)
MATRIX_BUTTON_LABEL = 75  # no buttons in Matrix: a reaction's or a line's label at most

# the adapter's own numbers
MATRIX_SYNC_TIMEOUT_MS = 30_000  # one /sync long poll
MATRIX_SYNC_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # waits after failed syncs, the last one repeated
MATRIX_TYPING_MS = 30_000  # one typing notice lasts this long; renewed at half of it while the turn runs
# a slow answer is shown while it is written, as a draft message edited in place; every edit is one more event in the
# room's history (and in every client's timeline), so they are rare: the first draft once the answer has been streaming
# this long (a quick answer gets none), then an edit at most every this often, at most this many edits an answer
MATRIX_DRAFT_AFTER_S = 2.0
MATRIX_DRAFT_EVERY_S = 2.0
MATRIX_DRAFT_EDITS = 10
MATRIX_DRAFT_TIMEOUT_S = 2.0  # a draft's send that takes longer is not worth waiting for (the answer goes on)
MATRIX_CUT_NOTE_S = 2.0  # sending the "cut short" note at a stop
MATRIX_EVENT_BYTES = 65_536  # the spec's limit of one event (its JSON, with the homeserver's own fields)
MATRIX_EVENT_HEADROOM = 2_048  # left of it for the fields the homeserver adds (ids, signatures, timestamps)
MATRIX_ACTIVITY_CHARS = 3_000  # the steps under an answer at most, in characters (each line kept whole)
MATRIX_CHOICES = 10  # buttons one message offers at most (the keycap reactions 1️⃣ … 🔟)
MATRIX_MAX_DOWNLOAD_BYTES = 50_000_000  # a file a person sends, at most (Synapse's default max_upload_size)
MATRIX_DOWNLOAD_TIMEOUT_S = 60.0  # fetching one file from the media repository
MATRIX_KEY_CHARS = 100  # a reaction's key longer than this is no button (a keycap or an emoji is a few characters)
MATRIX_RATE_LIMIT_TRIES = 5  # a request the homeserver rate-limits (429) is tried this many more times at most
MATRIX_RATE_LIMIT_WAIT_S = 1.0  # the wait before trying again when the homeserver does not say (retry_after_ms)
MATRIX_RATE_LIMIT_MAX_WAIT_S = 30.0  # a longer wait the homeserver asks for is cut to this
