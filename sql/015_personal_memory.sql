-- Personal memory stays personal, also for capability queries: a non-admin's query sees their memory rows only
-- in a personal turn (a private chat), which the bot says with `app.personal` and a signature over the user id
-- and the flag (a query can set the flag, not sign it). Archival entries are numbered per user (#1, #2, … of
-- that user: a global id told everyone how many entries all users had made), capped per user, and each
-- remembers the tool call that stored it, so a call retried after a dropped connection knows its own insert.

-- Whether this transaction is a personal turn of the signed user (sql/003's secret signs "<uid>:personal:on").
CREATE FUNCTION capability_personal_turn() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT coalesce(current_setting('app.personal', true) = 'on'
                    AND current_setting('app.personal_sig', true)
                        = capability_sign(current_setting('app.user_id', true) || ':personal:on'), false)
$$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'assistant_capability_reader') THEN
        GRANT SELECT ON memory_blocks, archival_memory TO assistant_capability_reader;
        DROP POLICY IF EXISTS capability_reader_own ON memory_blocks;
        DROP POLICY IF EXISTS capability_reader_own ON archival_memory;
        CREATE POLICY capability_reader_own ON memory_blocks FOR SELECT TO assistant_capability_reader
            USING (user_id = capability_user_id() AND capability_personal_turn());
        CREATE POLICY capability_reader_own ON archival_memory FOR SELECT TO assistant_capability_reader
            USING (user_id = capability_user_id() AND capability_personal_turn());
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'memory: cannot change the reader policies (%); non-admin capability queries see no memory', SQLERRM;
END
$$;

-- Per-user numbers: existing entries in the order they were made.
ALTER TABLE archival_memory ADD COLUMN number int, ADD COLUMN stored_by uuid;
UPDATE archival_memory a SET number = n.number
FROM (SELECT id, row_number() OVER (PARTITION BY user_id ORDER BY id) AS number FROM archival_memory) n
WHERE a.id = n.id;
ALTER TABLE archival_memory ALTER COLUMN number SET NOT NULL,
    ADD CONSTRAINT archival_memory_user_number UNIQUE (user_id, number);

-- Any insert without a number gets the user's next one (archival_insert holds the user's lock while it inserts).
CREATE FUNCTION archival_memory_number() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.number IS NULL THEN
        NEW.number := (SELECT coalesce(max(a.number), 0) + 1 FROM archival_memory a WHERE a.user_id = NEW.user_id);
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER archival_memory_number BEFORE INSERT ON archival_memory
    FOR EACH ROW EXECUTE FUNCTION archival_memory_number();

-- Store an entry once per user (sha256 of its text), under the user's memory lock (core/memory/blocks.py
-- lock_memory), and at most `max_entries` per user. One row: the entry's id and number, whether it was stored
-- by this call (`call`: also when an earlier attempt of the same call committed and its answer was lost), and
-- the user's entry count; id is null when the user already has `max_entries` entries.
CREATE FUNCTION archival_insert(uid bigint, body text, at timestamptz, call uuid, max_entries int)
RETURNS TABLE (id bigint, number int, fresh boolean, entries bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    digest bytea := sha256(convert_to(body, 'UTF8'));
    n bigint;
BEGIN
    PERFORM 1 FROM users u WHERE u.id = uid FOR NO KEY UPDATE;
    -- each statement below sees what committed while this one waited for the lock
    RETURN QUERY SELECT a.id, a.number, coalesce(a.stored_by = call, false), NULL::bigint
        FROM archival_memory a WHERE a.user_id = uid AND a.sha256 = digest;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT count(*) INTO n FROM archival_memory a WHERE a.user_id = uid;
    IF n >= max_entries THEN
        RETURN QUERY SELECT NULL::bigint, NULL::int, false, n;
        RETURN;
    END IF;
    PERFORM memory_learn_words(uid, body);
    RETURN QUERY INSERT INTO archival_memory AS a (user_id, content, sha256, created_at, stored_by)
        VALUES (uid, body, digest, at, call) RETURNING a.id, a.number, true, n + 1;
END
$$;
