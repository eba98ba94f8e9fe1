-- Self-written capabilities (code, description, parameters schema) with versions, and what their
-- database queries may see: admins everything (read only), other users only their own rows.

CREATE TABLE capabilities (
    name       text PRIMARY KEY,
    version    int NOT NULL,                      -- the current version (a rollback points it back)
    enabled    boolean NOT NULL DEFAULT true,
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text NOT NULL DEFAULT ''           -- platform:user_id of the admin
);

CREATE TABLE capability_versions (
    name              text NOT NULL REFERENCES capabilities(name) ON DELETE CASCADE,
    version           int NOT NULL,
    description       text NOT NULL,
    code              text NOT NULL,
    parameters_schema jsonb NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    created_by        text NOT NULL DEFAULT '',
    PRIMARY KEY (name, version)
);

-- A capability's query runs inside a SELECT wrapper: one read-only statement, rows as JSON.
-- Arguments arrive as text ($1::int casts them); at most `max_rows` rows come back.
CREATE FUNCTION capability_rows(q text, args text[], max_rows int) RETURNS SETOF json
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format('SELECT to_json(r) FROM (%s) r LIMIT %s', q, max_rows)
        USING args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8], args[9], args[10];
END
$$;

-- The speaking user's id for row-level security: set per transaction by the bot together with a
-- signature, so a query cannot claim another id by calling set_config itself.
CREATE TABLE capability_secret (secret text NOT NULL);
INSERT INTO capability_secret VALUES (gen_random_uuid()::text || gen_random_uuid()::text);
REVOKE ALL ON capability_secret FROM PUBLIC;

CREATE FUNCTION capability_sign(uid text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT encode(sha256(convert_to(s.secret || ':' || uid || ':' || s.secret, 'UTF8')), 'hex')
    FROM capability_secret s
$$;
REVOKE ALL ON FUNCTION capability_sign(text) FROM PUBLIC;

CREATE FUNCTION capability_user_id() RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT CASE WHEN current_setting('app.user_sig', true) = capability_sign(current_setting('app.user_id', true))
                THEN nullif(current_setting('app.user_id', true), '')::bigint END
$$;

-- The role non-admin queries run as. Roles are cluster-wide and creating one needs CREATEROLE (or
-- superuser): without it this block changes nothing and non-admin capability queries are refused.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'assistant_capability_reader') THEN
        CREATE ROLE assistant_capability_reader NOLOGIN;
    END IF;
    GRANT assistant_capability_reader TO CURRENT_USER;
    GRANT SELECT ON users, tasks, occurrences TO assistant_capability_reader;
    ALTER TABLE users ENABLE ROW LEVEL SECURITY;
    ALTER TABLE tasks ENABLE ROW LEVEL SECURITY;
    ALTER TABLE occurrences ENABLE ROW LEVEL SECURITY;
    CREATE POLICY capability_reader_own ON users FOR SELECT TO assistant_capability_reader
        USING (id = capability_user_id());
    CREATE POLICY capability_reader_own ON tasks FOR SELECT TO assistant_capability_reader
        USING (user_id = capability_user_id());
    CREATE POLICY capability_reader_own ON occurrences FOR SELECT TO assistant_capability_reader
        USING (task_id IN (SELECT id FROM tasks));
    -- Inside a SECURITY DEFINER function owned by the reader, queries run as the reader and cannot
    -- SET ROLE back (PostgreSQL forbids it there).
    CREATE FUNCTION capability_rows_as_reader(q text, args text[], max_rows int) RETURNS SETOF json
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS
        'SELECT capability_rows(q, args, max_rows)';
    EXECUTE 'GRANT CREATE ON SCHEMA public TO assistant_capability_reader';
    ALTER FUNCTION capability_rows_as_reader(text, text[], int) OWNER TO assistant_capability_reader;
    EXECUTE 'REVOKE CREATE ON SCHEMA public FROM assistant_capability_reader';
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'capabilities: cannot create the reader role (%); non-admin capability queries are off', SQLERRM;
END
$$;
