-- The per-person message rate is counted on the person's row, in the upsert that every turn's start already makes:
-- the row lock orders concurrent turns of one person (in different chats), so each sees the others' counts (a count
-- of recent turns in the statement's snapshot missed turns starting at the same moment). A window opens with a
-- person's first message and lasts a minute; scheduled jobs do not count.
ALTER TABLE users ADD COLUMN rate_window_start timestamptz, ADD COLUMN rate_count integer NOT NULL DEFAULT 0;
DROP INDEX turns_user_started;  -- sql/012's index for the count this replaces
