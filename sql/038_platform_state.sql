-- Small values an adapter keeps across restarts and shares between processes (issue 37): Matrix's sync token
-- (next_batch, written only after the events before it are in the inbox) and which of its rooms are direct chats.
CREATE TABLE platform_state (
    key text PRIMARY KEY,
    value text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
