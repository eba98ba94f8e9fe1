"""The HTTP API's fixed numbers."""

MAX_BODY_BYTES = 1 << 20  # a request body at most (413 past it): a message is at most MAX_MESSAGE_CHARS anyway
KEEPALIVE_S = 15.0  # an SSE comment after this long without an event (proxies close idle streams)
SESSIONS_LISTED = 200  # GET /v1/sessions lists at most this many, the most recently used first
PAGE_TURNS = 20  # turns per page of GET /v1/sessions/{id}/messages by default
PAGE_TURNS_MAX = 100  # and at most
RATE_WINDOW_S = 60.0  # API_REQUESTS_PER_MINUTE counts requests in this window, per token (or web sign-in)
PRESS_CHARS = 100  # a choice's press, as the button codec packs it (at most Discord's custom id)
ONE_SHOT_TITLE_CHARS = 60  # a one-shot session's title: the prompt's start
POLL_OTHER_PROCESS_S = 1.0  # a stream of an answer running in another process reads its progress this often
SIGNIN_FORM_BYTES = 4096  # the web page's sign-in form (one code) is read up to this many bytes
HTTP_UPLOAD_MAX_BYTES = 20 << 20  # the files of one message at most, decoded (Telegram's bots get 20 MB too)
HTTP_UPLOAD_MAX_FILES = 5  # files in one message at most
# the body of a route that takes files: base64 makes 4 bytes of every 3, plus the message's text and JSON around them
UPLOAD_BODY_BYTES = HTTP_UPLOAD_MAX_BYTES * 4 // 3 + MAX_BODY_BYTES
PARSE_OFF_LOOP_BYTES = 64 << 10  # a JSON body larger than this is parsed in a worker thread (adapters/http/body.py)
# brackets and commas a JSON body may hold (upper bounds of its containers and values): parsing and validating that
# many takes tens of milliseconds, and json.loads and pydantic each hold the GIL (the event loop) for all of it;
# 5,000 objects is an Open WebUI chat of a few thousand messages
JSON_CONTAINERS_MAX = 5_000
JSON_VALUES_MAX = 50_000
SCAN_STEP_BYTES = 1 << 20  # a large body is measured (and base64 decoded) in steps of this size: the loop runs between
