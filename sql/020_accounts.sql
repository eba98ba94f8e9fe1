-- Accounts: one person across platforms. An account owns tasks and reminders, memory, the time zone, usage and the
-- model choice; each platform identity (a `users` row: telegram id, discord id, the terminal user) belongs to one
-- account. Every existing user becomes an account with the same id and one identity, so the `user_id` columns of
-- tasks and memory (kept under that name: stored capability queries filter on `user_id = capability_user_id()`)
-- now hold account ids without rewriting a row. Turns and messages keep the identity that spoke.

-- Account ids come from the identities' sequence: an identity's first account has the identity's id (so a `users`
-- row inserted by hand owns tasks under its own id, as before), and an account made later (an identity unlinked)
-- can never take an id some identity's first account has or will have.
CREATE TABLE accounts (
    id         bigint PRIMARY KEY DEFAULT nextval('users_id_seq'),
    timezone   text,                              -- IANA name; NULL → DEFAULT_TIMEZONE
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO accounts (id, timezone, created_at) SELECT id, timezone, created_at FROM users;

-- A new identity gets its own account from the insert that creates it (an AFTER INSERT trigger: an upsert that
-- finds the identity inserts nothing, so it makes no account); the foreign key is checked at commit, after it.
ALTER TABLE users ADD COLUMN account_id bigint;
UPDATE users SET account_id = id;
ALTER TABLE users
    ALTER COLUMN account_id SET NOT NULL,
    ADD CONSTRAINT users_account_id_fkey FOREIGN KEY (account_id) REFERENCES accounts(id) ON DELETE CASCADE
        DEFERRABLE INITIALLY DEFERRED,
    DROP COLUMN timezone;
CREATE INDEX users_account ON users (account_id);

CREATE FUNCTION users_own_account() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.account_id := coalesce(NEW.account_id, NEW.id);
    RETURN NEW;
END
$$;
CREATE TRIGGER users_own_account BEFORE INSERT ON users FOR EACH ROW EXECUTE FUNCTION users_own_account();
CREATE FUNCTION users_new_account() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO accounts (id) VALUES (NEW.account_id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER users_new_account AFTER INSERT ON users FOR EACH ROW EXECUTE FUNCTION users_new_account();

-- The per-person rows now belong to the account. A task remembers the identity that made it: its reminder is for
-- that identity in the chat it was made in.
ALTER TABLE tasks ADD COLUMN created_by bigint REFERENCES users(id) ON DELETE SET NULL;
UPDATE tasks SET created_by = user_id;
ALTER TABLE tasks DROP CONSTRAINT tasks_user_id_fkey,
    ADD CONSTRAINT tasks_user_id_fkey FOREIGN KEY (user_id) REFERENCES accounts(id) ON DELETE CASCADE;
ALTER TABLE memory_blocks DROP CONSTRAINT memory_blocks_user_id_fkey,
    ADD CONSTRAINT memory_blocks_user_id_fkey FOREIGN KEY (user_id) REFERENCES accounts(id) ON DELETE CASCADE;
ALTER TABLE archival_memory DROP CONSTRAINT archival_memory_user_id_fkey,
    ADD CONSTRAINT archival_memory_user_id_fkey FOREIGN KEY (user_id) REFERENCES accounts(id) ON DELETE CASCADE;
ALTER TABLE memory_search_words DROP CONSTRAINT memory_search_words_user_id_fkey,
    ADD CONSTRAINT memory_search_words_user_id_fkey FOREIGN KEY (user_id) REFERENCES accounts(id) ON DELETE CASCADE;

-- A message teaches its words to its author's account (messages.user_id is the identity that wrote it).
CREATE OR REPLACE FUNCTION messages_learn_words() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM memory_learn_words((SELECT u.account_id FROM users u WHERE u.id = NEW.user_id), NEW.content);
    RETURN NULL;
END
$$;

-- The memory lock is the account's row now (core/memory/blocks.py lock_memory takes the same one).
CREATE OR REPLACE FUNCTION archival_insert(uid bigint, body text, at timestamptz, call uuid, max_entries int)
RETURNS TABLE (id bigint, number int, fresh boolean, entries bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    digest bytea := sha256(convert_to(body, 'UTF8'));
    n bigint;
BEGIN
    PERFORM 1 FROM accounts a WHERE a.id = uid FOR NO KEY UPDATE;
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

-- Capability queries: capability_user_id() is the speaker's account id; a non-admin sees the identities and the
-- account row of their own account.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'assistant_capability_reader') THEN
        DROP POLICY IF EXISTS capability_reader_own ON users;
        CREATE POLICY capability_reader_own ON users FOR SELECT TO assistant_capability_reader
            USING (account_id = capability_user_id());
        GRANT SELECT ON accounts TO assistant_capability_reader;
        ALTER TABLE accounts ENABLE ROW LEVEL SECURITY;
        CREATE POLICY capability_reader_own ON accounts FOR SELECT TO assistant_capability_reader
            USING (id = capability_user_id());
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'accounts: cannot change the reader policies (%); non-admin capability queries see no identities', SQLERRM;
END
$$;
