-- Memory per user: core memory blocks (lines the prompt carries on every private turn), archival memory
-- (searchable entries), and indexes for searching them and the conversation. Embeddings are optional and
-- added at start-up only when EMBEDDING_MODEL is set (pgvector may be missing on a managed server).

CREATE EXTENSION IF NOT EXISTS pg_trgm;    -- trusted: the database owner may create it
CREATE EXTENSION IF NOT EXISTS btree_gin;  -- trusted: lets one GIN index hold (user_id, words)

-- human and persona exist for everyone without a row (the code shows them empty); a custom block is a row
-- created by its first append and removed with its last line.
CREATE TABLE memory_blocks (
    user_id    bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name       text NOT NULL CHECK (name ~ '^[a-z][a-z0-9_]{0,31}$'),
    lines      text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, name)
);

CREATE TABLE archival_memory (
    id         bigserial PRIMARY KEY,
    user_id    bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    content    text NOT NULL CHECK (length(content) BETWEEN 1 AND 4000),
    sha256     bytea NOT NULL,
    words      tsvector GENERATED ALWAYS AS (to_tsvector('simple', content)) STORED,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (user_id, sha256)
);
CREATE INDEX archival_memory_words ON archival_memory USING gin (user_id, words);

-- Typos and partial words: a query word the user never used is widened to their known words that start with
-- the same letter and are similar (pg_trgm similarity) or longer (prefix), before the full-text match; so
-- trigram work is over a few short words, not whole texts. Each user's words come from their archival entries
-- (on insert) and their messages (trigger); per user, so a search cannot tell whether anybody else ever
-- wrote a word. Byte order ("C") makes "same first letter" one range of the primary key.
CREATE TABLE memory_search_words (
    user_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    word    text COLLATE "C" NOT NULL,
    PRIMARY KEY (user_id, word)
);

CREATE FUNCTION memory_learn_words(uid bigint, content text) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO memory_search_words (user_id, word)
    SELECT uid, w FROM unnest(tsvector_to_array(to_tsvector('simple', content))) w
    WHERE uid IS NOT NULL AND length(w) BETWEEN 3 AND 32 AND w ~ '[[:alpha:]]'
    ORDER BY w  -- one order: concurrent learners cannot deadlock
    ON CONFLICT DO NOTHING
$$;

-- Only the user's own messages teach words (what they type is what they misspell; one insert per turn pays).
CREATE FUNCTION messages_learn_words() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM memory_learn_words(NEW.user_id, NEW.content);
    RETURN NULL;
END
$$;
CREATE TRIGGER messages_learn_words AFTER INSERT ON messages FOR EACH ROW
    WHEN (NEW.role = 'user' AND NEW.content IS NOT NULL) EXECUTE FUNCTION messages_learn_words();
SELECT count(memory_learn_words(user_id, content)) FROM messages WHERE role = 'user' AND content IS NOT NULL;

-- conversation_search: the chats a user spoke in (their private chats whole, their own lines in groups).
CREATE INDEX turns_user_chat ON turns (user_id, chat_id);
CREATE INDEX messages_search_words ON messages USING gin (chat_id, to_tsvector('simple', content))
    WHERE role IN ('user', 'assistant') AND content IS NOT NULL;

-- A user's blocks as JSON for the turn's context query: [{"name", "lines"}], human and persona first.
CREATE FUNCTION memory_blocks_json(uid bigint) RETURNS json
LANGUAGE sql STABLE AS $$
    SELECT coalesce(json_agg(json_build_object('name', b.name, 'lines', b.lines)
                             ORDER BY b.name <> 'human', b.name <> 'persona', b.created_at, b.name), '[]')
    FROM memory_blocks b WHERE b.user_id = uid
$$;

-- Capability queries of non-admins see only their own memory (sql/003's reader role and signed user id).
DO $$
BEGIN
    ALTER TABLE memory_blocks ENABLE ROW LEVEL SECURITY;
    ALTER TABLE archival_memory ENABLE ROW LEVEL SECURITY;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'assistant_capability_reader') THEN
        GRANT SELECT ON memory_blocks, archival_memory TO assistant_capability_reader;
        CREATE POLICY capability_reader_own ON memory_blocks FOR SELECT TO assistant_capability_reader
            USING (user_id = capability_user_id());
        CREATE POLICY capability_reader_own ON archival_memory FOR SELECT TO assistant_capability_reader
            USING (user_id = capability_user_id());
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'memory: cannot extend the reader role (%); non-admin capability queries see no memory', SQLERRM;
END
$$;
