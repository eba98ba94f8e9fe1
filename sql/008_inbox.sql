-- The inbox: each platform update is stored here before the platform is told it arrived (webhook 200, or the
-- next getUpdates offset), then any process of the bot takes it. Updates with the same chat_key are handled one
-- at a time, in update_id order, across all processes; different chats run side by side. A process holds an
-- update with a lease that it renews while it works; when the process dies, the lease runs out and another one
-- takes the update again (attempts > 1 tells the handler that it may have been half done).
CREATE TABLE inbox (
    platform    text NOT NULL,
    update_id   bigint NOT NULL,          -- the platform's id of the update (Telegram's increase)
    chat_key    text NOT NULL,            -- one at a time per key, in update_id order
    payload     jsonb NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    attempts    int NOT NULL DEFAULT 0,
    owner       text,                     -- the process holding the lease
    lease_until timestamptz,
    done_at     timestamptz,
    PRIMARY KEY (platform, update_id)     -- a redelivered update is stored once
);
CREATE INDEX inbox_open ON inbox (update_id) WHERE done_at IS NULL;
CREATE INDEX inbox_open_chat ON inbox (platform, chat_key, update_id) WHERE done_at IS NULL;
CREATE INDEX inbox_done ON inbox (done_at) WHERE done_at IS NOT NULL;

-- Wakes idle processes when an update is stored (they also look every INBOX_POLL_S without it).
CREATE FUNCTION inbox_stored() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('inbox', NEW.platform);
    RETURN NULL;
END
$$;

CREATE TRIGGER inbox_stored AFTER INSERT ON inbox FOR EACH ROW EXECUTE FUNCTION inbox_stored();
