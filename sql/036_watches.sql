-- Watching a page (/watch, the watch_page tool): a task of kind 'watch' with an interval recurrence, so each due
-- check is an occurrence claimed exactly once across processes like a reminder's. A check that finds the page
-- unchanged (or fails quietly) ends its occurrence as 'checked'; one that has something to say is sent like a
-- reminder. A watch that could not be read for a day is 'paused' (not open: not checked, not counted in
-- MAX_OPEN_TASKS; /tasks and /watch show it).
ALTER TABLE tasks DROP CONSTRAINT tasks_kind_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_kind_check CHECK (kind IN ('reminder', 'agent', 'watch'));
ALTER TABLE tasks DROP CONSTRAINT tasks_status_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_status_check
    CHECK (status IN ('pending', 'in_progress', 'done', 'cancelled', 'paused'));
ALTER TABLE occurrences DROP CONSTRAINT occurrences_status_check;
ALTER TABLE occurrences ADD CONSTRAINT occurrences_status_check
    CHECK (status IN ('claimed', 'delivered', 'failed', 'skipped', 'checked'));

CREATE TABLE watches (
    task_id       bigint PRIMARY KEY REFERENCES tasks(id) ON DELETE CASCADE,
    url           text NOT NULL,
    title         text NOT NULL DEFAULT '',  -- the page's title when last read
    seen_hash     text,                      -- sha256 of its main text, whitespace collapsed
    seen_text     text,                      -- that text (cut), for the next change's diff
    checked_at    timestamptz,               -- the last check that read the page
    failures      int NOT NULL DEFAULT 0,    -- checks in a row that could not read it
    failing_since timestamptz,               -- the first of those
    reported      boolean NOT NULL DEFAULT false,  -- those failures were reported (once)
    last_error    text
);
