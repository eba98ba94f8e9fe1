-- Platform updates that could not be stored or parsed (core/storage/dead_letters.py): kept here instead of being
-- retried for ever, so one poison update never stops the chats behind it. Shown to admins in /status, counted in
-- /metrics, pruned with RETENTION_DAYS. `payload` is a capped, escaped copy of what the platform sent (text: it may
-- hold what jsonb cannot).
CREATE TABLE dead_letters (
    id         bigserial PRIMARY KEY,
    platform   text NOT NULL,
    update_id  bigint,                                  -- NULL when the payload did not even say which update it was
    reason     text NOT NULL,
    payload    text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX dead_letters_update ON dead_letters (platform, update_id) WHERE update_id IS NOT NULL;
CREATE INDEX dead_letters_created ON dead_letters (created_at);
