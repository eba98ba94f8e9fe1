-- Users, chats, turns, conversation messages and tasks.

CREATE TABLE users (
    id               bigserial PRIMARY KEY,
    platform         text NOT NULL,
    platform_user_id text NOT NULL,
    display_name     text NOT NULL DEFAULT '',
    timezone         text,                       -- IANA name; NULL → DEFAULT_TIMEZONE
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (platform, platform_user_id)
);

CREATE TABLE chats (
    id               bigserial PRIMARY KEY,
    platform         text NOT NULL,
    platform_chat_id text NOT NULL,
    thread_id        text NOT NULL DEFAULT '',   -- forum topic / Discord thread; '' for none
    kind             text NOT NULL DEFAULT 'private' CHECK (kind IN ('private', 'group')),
    title            text NOT NULL DEFAULT '',
    history_floor    bigint NOT NULL DEFAULT 0,  -- /reset: messages with id <= floor are not replayed
    created_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (platform, platform_chat_id, thread_id)
);

-- One turn per incoming platform message; the unique key answers a re-delivered update once.
CREATE TABLE turns (
    id                  bigserial PRIMARY KEY,
    chat_id             bigint NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    user_id             bigint REFERENCES users(id) ON DELETE SET NULL,
    platform_message_id text,
    status              text NOT NULL DEFAULT 'running'
                        CHECK (status IN ('running', 'done', 'cut_short', 'failed')),
    steps               int NOT NULL DEFAULT 0,
    started_at          timestamptz NOT NULL DEFAULT now(),
    finished_at         timestamptz
);
CREATE UNIQUE INDEX turns_platform_message ON turns (chat_id, platform_message_id)
    WHERE platform_message_id IS NOT NULL;

CREATE TABLE messages (
    id                  bigserial PRIMARY KEY,
    chat_id             bigint NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    turn_id             bigint REFERENCES turns(id) ON DELETE SET NULL,
    user_id             bigint REFERENCES users(id) ON DELETE SET NULL,  -- author of a user message
    role                text NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
    content             text,
    author_name         text NOT NULL DEFAULT '',
    tool_calls          jsonb,                   -- assistant: [{id, type, function: {name, arguments}}]
    tool_call_id        text,                    -- tool: which call this answers
    tool_name           text,
    tool_ok             boolean,
    duration_ms         int,
    platform_message_id text,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX messages_chat_id ON messages (chat_id, id DESC);
CREATE INDEX messages_turn ON messages (turn_id);

CREATE TABLE tasks (
    id          bigserial PRIMARY KEY,
    user_id     bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    chat_id     bigint REFERENCES chats(id) ON DELETE SET NULL,    -- where reminders are delivered
    title       text NOT NULL CHECK (length(title) BETWEEN 1 AND 500),
    details     text NOT NULL DEFAULT '',
    status      text NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'in_progress', 'done', 'cancelled')),
    due_at      timestamptz,
    recurrence  jsonb,                           -- {"kind": "cron"|"interval", ...}; NULL → one-shot
    timezone    text,                            -- the owner's zone when the recurrence was set
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tasks_user_status ON tasks (user_id, status, due_at);
CREATE INDEX tasks_due_open ON tasks (due_at) WHERE status IN ('pending', 'in_progress');
