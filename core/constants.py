"""The core's fixed numbers in one place (sizes, cuts, caps, timeouts); each platform keeps its own in its adapter.

A leaf: imports nothing from the project. Settings an operator sets (core/settings.py) are configuration, not
constants. Times end in _S (seconds) or _MS, or are timedeltas.
"""

from __future__ import annotations

from datetime import timedelta

# Incoming messages and the access policy.
REFUSAL_EVERY_S = 3600.0  # a refused user is told at most once per chat per hour

# What the prompt gets (the database keeps everything whole).
TOOL_RESULT_PROMPT_CHARS = 4000  # a tool result longer than this is cut for the prompt
TOOL_ARGUMENTS_PROMPT_CHARS = 8000  # so are a tool call's arguments (code for write_capability fits)
TOOL_NAME_CHARS = 64  # the API's limit for a function name; a longer (made-up) name is cut in the prompt
ANSWER_PROMPT_CHARS = 16000  # an earlier answer of the model longer than this is cut when replayed
DUE_SOON = timedelta(hours=48)  # reminders due within this are listed in the system prompt
DUE_SOON_LINES = 10  # at most this many of them

# The agent loop and the LLM.
WRAP_UP_MIN_S = 2.0  # a wrap-up call needs at least this much of the time budget left
ABANDONED_MARGIN = timedelta(minutes=5)  # a turn running this much longer than AGENT_TOTAL_TIMEOUT is dead
REASON_CHARS = 200  # the server's reason for a refused request, cut to one line of this length
MODEL_CONNECT_TIMEOUT_S = 10.0  # connecting to a model server (a request then gets AGENT_STEP_TIMEOUT)

# Voice notes (core/media/audio.py).
SPEECH_VOICE = "alloy"  # the voice of spoken answers (one every OpenAI-compatible speech server knows)
SPEECH_INPUT_CHARS = 4096  # the speech API's input limit: a longer answer is cut to it

# Token budgets (core/accounts/usage.py, sql/022).
USAGE_CALL_RESERVE = 16_000  # tokens a model call in flight counts against a budget until its usage is written
USAGE_LEASE_MARGIN = timedelta(seconds=30)  # a call's reservation lapses this long after AGENT_STEP_TIMEOUT
USAGE_BUSY_POLL_S = 0.05  # a call near a budget waits for the account's calls in flight, asking again this often
MAX_MODELS = 20  # LLM_MODELS lists at most this many: with the default, each gets a button in one message

# The activity part of a reply.
OUTCOME_CHARS = 90  # one activity line's outcome is cut to this many characters
ACTIVITY_LINES = 12  # at most this many tool lines are shown; the rest are counted

# Built-in tools.
SQL_STATEMENT_TIMEOUT_MS = 5000  # execute_sql's statement timeout (less when the step has less time left)
SQL_MAX_ROWS = 50  # execute_sql returns at most this many rows
SQL_MAX_CHARS = 6000  # and at most this many characters of them as JSON
TASK_LIST_ROWS = 50  # manage_tasks list and the open tasks shown at most
EXPORT_PREFETCH = 1000  # /export reads an account's messages this many at a time (its memory stays flat)
NEXT_OCCURRENCES = 3  # a recurring task shows this many of its next times
EXAMPLE_CHARS = 40  # a /remind refusal's example repeats at most this much of the person's reminder text
MAX_WHEN_WORDS = 8  # the longest time of day or date /remind looks for before the reminder's text
VALIDATION_PROBLEMS_SHOWN = 6  # a tool call's invalid arguments: at most this many problems named to the model

# Capabilities.
CAPABILITY_RESULT_CHARS = 20000  # a capability's result is cut to this (the prompt gets at most the tool result limit)
CAPABILITY_LIVE_CALLS = 16  # capability calls (and imports) still running at once, runaways included
CAPABILITY_LIVE_CALLS_PER_USER = 4  # of those, one user's (so one runaway capability cannot take them all)
QUERY_TIMEOUT_MS = 5000  # statement timeout of a capability's database query
QUERY_MAX_ROWS = 1000  # rows a capability's query returns at most
QUERY_MAX_ARGS = 10  # arguments a capability's query takes at most

# Reminders.
REMINDER_LEASE = timedelta(minutes=2)  # a claimed occurrence is this process's until then (renewed while sending)
REMINDER_LATE_AFTER = timedelta(seconds=60)  # a reminder sent later than this after its due time is counted late
REMINDER_BATCH = 500  # due occurrences claimed per query
REMINDER_RETRY_FIRST = timedelta(seconds=5)  # the first retry of a failed send waits this long
REMINDER_RETRY_MAX = timedelta(minutes=5)  # the growing wait between retries stops growing here
REMINDER_SENDS = 64  # reminders being sent at once
REMINDER_AGENT_RUNS = 8  # of those, ones that run the agent at once
REMINDER_SWEEP_S = 30.0  # the scheduler looks for due reminders at least this often
REMINDER_FULL_SWEEP = timedelta(hours=1)  # a sweep looks at every open task due before the grace window this often
REMINDER_STALE_OVERLAP = timedelta(minutes=1)  # between full sweeps: due times since the last sweep, and this before
REMINDER_MAX_PLANNED = 20000  # date jobs planned ahead at most
REMINDER_ERROR_CHARS = 500  # a failed send's error is stored cut to this

# Watching a page (/watch, watch_page; core/reminders/watching.py).
WATCH_EVERY_MINUTES = 60  # a page is checked this often unless the person says otherwise
WATCH_URL_CHARS = 2000  # a watched address is at most this long
WATCH_MOST_MINUTES = 525600  # a page is checked at least once a year (the longest interval a recurrence holds)
WATCH_TEXT_CHARS = 100_000  # the page text kept for the next change's diff (the hash covers all of it)
WATCH_DIFF_LINES = 15  # changed lines a change message shows at most
WATCH_LINE_CHARS = 200  # each cut to this
WATCH_REPORT_AFTER = 3  # failed checks in a row before they are reported (once)
WATCH_PAUSE_AFTER = timedelta(days=1)  # a page failing this long is no longer checked
WATCH_FETCH_TIMEOUT_S = 60.0  # one read of a page, whatever the reader's own limits
WATCH_CHECKS = 8  # pages being checked at once
WATCH_STOP_BUTTONS = 25  # Stop buttons under /watch's list at most (Discord's 5 rows of 5)

# The database.
CONNECT_TIMEOUT_S = 10.0  # start-up gives up on a database that does not answer within this many seconds
SLOW_START_NOTE_S = 1.0  # a start-up step (the embedded server's initdb or start) longer than this says so
POOL_MIN_SIZE = 10  # connections the pool keeps open
POOL_MAX_SIZE = 20  # connections the pool opens at most
DISCARD_CLOSE_TIMEOUT_S = 5.0  # closing a connection whose session cannot be reset waits at most this
DROP_RETRY_DELAYS = (0.0, 0.25, 1.0)  # seconds before each retry of a call whose connection was dropped
LISTEN_RETRY_S = 1.0  # a lost LISTEN connection (capability changes, inbox) connects again after this pause
LISTEN_CHECK_S = 30.0  # a quiet listener checks its connection (SELECT 1) this often

# Health and metrics (the HTTP server on PORT).
READY_DB_TIMEOUT_S = 2.0  # /readyz: the database must answer SELECT 1 within this many seconds
HTTP_CLOSE_GRACE_S = 1.0  # on stop, requests under way get this long, then open connections (streams) are closed
HTTP_KEEP_ALIVE_S = 75  # an idle kept-alive connection stays open this long (longer than proxies keep theirs)
TURN_SECONDS_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0)  # bot_turn_seconds
LLM_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0)  # bot_llm_request_seconds
REMINDER_LATENESS_BUCKETS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0)

# The fleet: the processes on one database, for /status (table `processes`).
FLEET_BEAT_S = 15.0  # each process upserts its row this often
FLEET_SEEN_S = 60.0  # /status lists the processes seen within this many seconds
FLEET_ALIVE_S = 40.0  # a process that beat within this counts as running (shares of a platform's rate limit)
FLEET_FORGET = timedelta(days=1)  # a beat deletes the rows of processes not seen for this long (killed ones)
FLEET_HOST_CHARS = 64  # a process's host name is stored cut to this
FLEET_ADAPTER_CHARS = 80  # each adapter's "name (state)" is stored cut to this

# Memory (core memory blocks, archival memory, conversation search).
MEMORY_MAX_BLOCKS = 10  # human, persona and up to eight custom blocks: every block travels with every request
MEMORY_LINE_CHARS = 1000  # one line of a block at most (the word limit alone lets a line without spaces through)
MEMORY_WORD_CHARS = 10  # a longer piece without spaces counts one word per started 10 characters (tokens)
MEMORY_NAME_SHOW_CHARS = 40  # an invalid block name is quoted back cut to this (names have at most 32)
MEMORY_WARN_SHARE = 0.8  # at this share of a block's word limit the model is asked to consolidate
MEMORY_PAGE_SIZE = 5  # search results per page
MEMORY_ENTRY_SHOW_CHARS = 1000  # a longer entry or message is shown cut, with a marker saying how much more there is
MEMORY_VECTOR_CANDIDATES = 20  # nearest archival entries by embedding that may join the ranking
MEMORY_VECTOR_MIN_SIMILARITY = 0.45  # cosine similarity below this does not count as a match
MEMORY_EMBED_TIMEOUT_S = 15.0  # one embedding call gives up after this (the insert is kept without a vector)
ARCHIVAL_CONTENT_CHARS = 4000  # one archival entry at most
MEMORY_QUERY_CHARS = 500  # a search query at most
MEMORY_TYPO_MIN_CHARS = 3  # a query word the user never used, this long or longer, also matches as a prefix or typo
MEMORY_TYPO_SIMILARITY = 0.3  # pg_trgm similarity from which one of the user's words counts as that typo's word
MEMORY_TYPO_LENGTH_SLACK = 2  # such a word is at most this many characters shorter or longer
MEMORY_TYPO_WORDS = 3  # at most this many of them per query word
MEMORY_TYPO_QUERY_WORDS = 8  # at most this many unknown words of one query are widened so (the longest)
MEMORY_SEARCH_MAX_PAGE = 1_000_000  # a later page is past the end for anyone (its OFFSET must fit a bigint)


# The inbox (sql/008): platform updates stored before they are acknowledged, taken by any process.
INBOX_LEASE_S = 30.0  # a taken update is this process's until then (renewed every third of it while it runs)
INBOX_MAX_ATTEMPTS = 3  # an update whose process died this often while handling it is given up (logged)
INBOX_POLL_S = 1.0  # an idle process looks for updates this often even without a notification
INBOX_CONCURRENCY = 64  # updates (so chats) one process handles at the same time
INBOX_KEEP_DONE_S = 2 * 24 * 3600.0  # handled updates are kept this long so a redelivery is recognised
INBOX_FORGET_BATCH = 1000  # at most this many handled updates are deleted per renewal round
INBOX_RETRY_S = 1.0  # a failed claim or finish (database down) is tried again after this pause
INBOX_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DEAD_LETTER_PAYLOAD_CHARS = 16_000  # the copy of an unstorable update's payload kept as a dead letter is cut here
DEAD_LETTER_REASON_CHARS = 300  # and its reason

# Retention (core/storage/retention.py; RETENTION_DAYS, the occurrences' age, is a setting).
RETENTION_EVERY_S = 600.0  # each process prunes old rows at start and then this often
RETENTION_BATCH = 1000  # rows one DELETE removes at most
RETENTION_ROUNDS = 10  # batches per table and prune at most (a larger backlog goes at the next prunes)
REFUSAL_KEEP = timedelta(days=1)  # a chat's last refusal notice is deleted after this (only the last hour counts)

# Linking identities (core/accounts/linking.py, sql/021): one-time codes and the lock after wrong ones.
LINK_CODE_ALPHABET = "23456789ABCDEFGHJKLMNPQRSTUVWXYZ"  # 32 symbols, no 0/O or 1/I look-alikes
LINK_CODE_CHARS = 8  # 32^8 = 2^40 codes, shown as two groups of four (K7QX-M2PA)
LINK_CODE_TTL = timedelta(minutes=10)  # a code works this long after /link made it, once
LINK_LIVE_CODES = 3  # unused codes one identity may hold at a time (older ones stop working)
LINK_MAX_WRONG = 5  # wrong codes within LINK_LOCK that lock linking for the trying identity …
LINK_LOCK = timedelta(hours=1)  # … for this long
LINK_KEEP = timedelta(days=1)  # expired codes are deleted after this (when the next code is made)
LINK_RETRIES = 3  # a link whose accounts changed while it waited for them starts over at most this often
LINK_NOTICE_TIMEOUT_S = 10.0  # telling the code's issuer gives up after this (the link stands)

# Per-account bearer tokens (core/accounts/api_tokens.py, sql/025): `/token new NAME`, `bot token`.
API_TOKEN_PREFIX = "abt_"  # every secret starts with it (a scanner can spot a leaked one)
API_TOKEN_BYTES = 24  # random bytes of a secret: 32 url-safe characters after the prefix
API_TOKEN_MAX_LIVE = 20  # live (not revoked) tokens one account may hold
API_TOKEN_NAME_CHARS = 40  # a token's name at most (letters, digits, `.`, `_`, `-`)
API_TOKEN_TOUCH_EVERY = timedelta(minutes=1)  # last_used_at is written at most this often per token
API_SESSION_ID_BYTES = 16  # random bytes of a session id (22 url-safe characters after `ses_`)
API_MESSAGE_ID_BYTES = 12  # bytes of an API turn's message id (hex)
API_SESSION_TITLE_CHARS = 120  # a session's title at most
API_TITLE_FROM_MESSAGE_CHARS = 60  # a session made without a title is titled with its first message's start
API_RESULT_SHOWN = 2000  # characters of a tool result a message part shows; the whole is an artifact
API_FEED_KEEP_S = 300.0  # a finished answer's live events stay this long in its process, for a client to resume
API_FEEDS_KEPT = 1000  # finished answers' feeds kept at most (the oldest go first)

# Signing in to the web chat page (core/accounts/web_signin.py, sql/027): `/web` makes a one-time link.
WEB_LINK_TTL = timedelta(minutes=10)  # a link works this long after /web made it, once
WEB_LINK_BYTES = 24  # random bytes of a link's code: 32 url-safe characters
WEB_LINK_LIVE = 5  # unused links one identity may hold at a time (older ones stop working)
WEB_LOGIN_TTL = timedelta(days=30)  # a web sign-in (its cookie) lasts this long, then /web again
WEB_LOGIN_BYTES = 32  # random bytes of a sign-in's cookie secret and of its CSRF token: 43 url-safe characters
WEB_LOGIN_MAX_LIVE = 20  # live sign-ins one identity may hold (a new one ends the oldest past it)
WEB_KEEP = timedelta(days=1)  # used, expired and signed-out rows are deleted after this (when a link is made or used)

# Photos people send (core/media/images.py): resized and re-encoded before the model sees them.
MEDIA_IMAGE_MAX_INPUT_BYTES = 20 * 1024 * 1024  # an image file over this is refused before it is opened
MEDIA_IMAGE_MAX_PIXELS = 16_000_000  # pixels decoded at most (a JPEG is decoded scaled down first); more is refused
MEDIA_IMAGE_MAX_SIDE = 1568  # the long side of the image the model gets, at most (never upscaled)
MEDIA_IMAGE_MAX_BYTES = 1_000_000  # the JPEG the model gets (and the database keeps), at most
MEDIA_IMAGE_JPEG_QUALITY = 85  # the JPEG quality tried first …
MEDIA_IMAGE_QUALITY_STEP = 10  # … lowered by this while the JPEG is over MEDIA_IMAGE_MAX_BYTES …
MEDIA_IMAGE_MIN_QUALITY = 45  # … down to this; then the image is made smaller instead …
MEDIA_IMAGE_SHRINK = 0.75  # … by this factor per side at a time …
MEDIA_IMAGE_MIN_SIDE = 64  # … until its long side would go under this (then it is refused)
MEDIA_REPLAY_IMAGES = 3  # the newest photos of a chat a turn sends as images (older ones: their mark and caption)
MEDIA_STICKER_NAME_CHARS = 60  # a sticker's or GIF's name shown to the model, at most
MEDIA_STICKER_EMOJI_CHARS = 16  # a sticker's emoji shown to the model, at most (ZWJ sequences are long)

# Documents people send (core/media/documents.py): text extracted in a worker thread within these caps.
MEDIA_DOC_MAX_BYTES = 20 * 1024 * 1024  # a document over this is refused before it is opened (a Telegram bot's cap)
MEDIA_DOC_MAX_PAGES = 500  # a PDF's pages read at most (the rest are counted, not read)
MEDIA_DOC_MAX_CHARS = 2_000_000  # characters of text kept of any document at most (a long book); reading stops there
MEDIA_DOC_PAGE_CHARS = 3000  # a Word or text file is split into pages of at most this many characters
MEDIA_DOC_TIMEOUT_S = 20.0  # reading one document gives up after this (its worker stops at its next page)
MEDIA_DOC_DETECT_BYTES = 256 * 1024  # a text file's encoding is guessed, and binary spotted, from this many first bytes
MEDIA_DOC_MAX_CONTROL = 0.01  # a "text" with more than this share of control characters (NUL, …) is binary
MEDIA_ZIP_MAX_BYTES = 40 * 1024 * 1024  # a Word file unpacking to more than this in all is refused unopened …
MEDIA_ZIP_MAX_ENTRIES = 2000  # … so is one of more files than this …
MEDIA_ZIP_MAX_RATIO = 200  # … or with a file over MEDIA_ZIP_RATIO_FROM_BYTES packed more tightly than this …
MEDIA_ZIP_RATIO_FROM_BYTES = 1024 * 1024  # … (small files may pack tightly: no zip bomb is small)
MEDIA_DOCX_MAX_XML_BYTES = 10 * 1024 * 1024  # … or whose text part (parsed into memory, ~6x) is larger than this
MEDIA_FIRST_PAGE_CHARS = 6000  # of a document, what goes into the turn itself (read_attachment pages through the rest)
MEDIA_MEMORY_MAX_CHUNKS = 300  # a file saved to archival memory goes in at most this many entries (~1.2 M characters)
MEDIA_HEARD_CHARS = 200  # a transcript as the reply's "heard" step shows it, at most

# MCP tool servers (core/mcp_servers/): the configuration file MCP_CONFIG names (core/mcp_servers/config.py).
MCP_CONFIG_MAX_BYTES = 1024 * 1024  # a larger configuration file is refused unread (it lists servers, not data)
MCP_SERVER_NAME_CHARS = 32  # a server's name: letters, digits, _ and -, at most this long (it goes into tool names)
MCP_SSE_READ_TIMEOUT_S = 300.0  # a streamable-HTTP server's event stream may stay silent this long (the SDK's own)
MCP_CALL_TIMEOUT_S = 30.0  # a server's `timeout` unless the file says otherwise: one tool call
MCP_CONNECT_TIMEOUT_S = 10.0  # a server's `connect_timeout` unless the file says otherwise
MCP_SESSION_BODY_BYTES = 64 * 1024  # of an HTTP server's 400, read to look for words saying the session is lost
MCP_MAX_TIMEOUT_S = 3600.0  # either timeout at most (more is a unit mistake: the file gives seconds, not ms)
TOOL_NAMES_SHOWN = 30  # a call of an unknown tool is answered with at most this many names of the tools there are
MCP_NAME_CHARS = 64  # an MCP tool's name for the model (mcp__<server>__<tool>), at most: longer is cut, with a hash
MCP_DESCRIPTION_CHARS = 300  # an MCP tool's description for the model, at most (a long one costs every request)
MCP_SEARCH_RESULTS = 5  # tools mcp_search returns (and adds to the turn) at most
# A connection to an MCP server (core/mcp_servers/connection.py, transports.py, results.py).
MCP_RESULT_CHARS = 8000  # a tool result's text for the model, at most: longer keeps its head and tail and says the cut
MCP_FAILURES_BEFORE_PAUSE = 3  # connection attempts failing in a row before a server is paused (for pause_s)
MCP_PAGES_MAX = 20  # pages of a server's tool list read at most (a paginator that never ends cannot hang start-up)
MCP_STDIO_LINE_BYTES = 16 * 1024 * 1024  # one message from a stdio server at most: longer breaks the connection
MCP_CALL_GRACE_S = 1.0  # a call's backstop past its timeout (the SDK's own clock starts once the request is written)
MCP_STDIO_EXIT_S = 2.0  # a stdio server closing gets this long to exit after its stdin closes, then is killed
MCP_LINE_CHARS = 200  # a line about a server (its last error, a failed call, a resource's name or URI), at most
MCP_CONFIRM_TTL_S = 86400.0  # a call of an untrusted server waiting for the person's OK (its button) works this long
MCP_ALLOWED_RESULT_CHARS = 1500  # the result of a call run after the person's OK, as shown to them, at most
# Per-person accounts at MCP servers (`credentials: per_person`; core/mcp_servers/oauth.py, hub.py).
MCP_PERSON_IDLE_S = 900.0  # a person's connection to a server unused this long is closed (opened again on next use)
MCP_PERSON_SWEEP_S = 60.0  # how often idle per-person connections are looked for
MCP_OAUTH_LINK_S = 600.0  # an authorization link of /mcp connect works this long (the flow waits for it as long)

# Fetching a web page (core/web/fetch.py, core/web/safety.py); its size cap is WEB_FETCH_MAX_MB, a setting.
WEB_FETCH_TIMEOUT_S = (
    20.0  # one fetch in all (address lookup, redirects, the body, reading its text) gives up after this
)
WEB_MAX_REDIRECTS = 5  # redirects followed at most (each one checked like the first address)
WEB_PAGE_CHARS = (
    3000  # a page's text is split into pages of at most this many characters (fits a tool result's prompt cut)
)
WEB_READ_CHUNK_BYTES = 64 * 1024  # the body is read (and decompressed) this much at a time
WEB_CHARSET_SNIFF_BYTES = 4096  # an HTML page's <meta charset> is looked for in this many first bytes
WEB_SHOWN_URL_CHARS = 120  # an address in a failure's one line is cut to this

# Web search (core/web/search.py; the provider and its keys are settings).
WEB_SEARCH_MAX_RESULTS = 8  # results one search returns at most (a count asked for is kept within 1 and this)
WEB_SEARCH_TIMEOUT_S = 10.0  # one search gives up after this (connecting, the provider's answer, reading it)
WEB_SEARCH_CACHE_S = 300.0  # the same search (provider, query, count) is answered from memory for this long
WEB_SEARCH_CACHE_ENTRIES = 256  # searches kept in that memory at most (the oldest used goes first)
WEB_SEARCH_QUERY_CHARS = 400  # a longer query is refused (Brave's own limit; no provider needs more)
WEB_SEARCH_TITLE_CHARS = 200  # a result's title is cut to this
WEB_SEARCH_SNIPPET_CHARS = 500  # and its snippet to this
WEB_SEARCH_ERROR_CHARS = 200  # a library's own error text in a failure line is cut to this
WEB_SEARCH_DEFAULT_RESULTS = 5  # web_search's results when the model asks for no number (core/web/tools.py)
CITED_TITLE_CHARS = 80  # a source's title at most in the list an answer that used the web ends with
WEB_PAGES_KEEP_S = 300.0  # a document web_fetch read is kept this long, so its next pages cost no new fetch
WEB_PAGES_KEPT = 16  # documents kept so at most (the oldest used goes first)
