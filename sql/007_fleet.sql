-- State that several processes on one database share.

-- A refused user is told at most once per chat per hour, across every process: the last notice per chat.
CREATE TABLE refusal_notices (
    chat_key text PRIMARY KEY,
    told_at timestamptz NOT NULL
);

-- Every change to a capability (write, rollback, enable, disable; also by hand) notifies the channel
-- `capability_changed` on commit with the name and version only (never the code); each process LISTENs
-- and reloads that capability from the table. An empty object (TRUNCATE) means: reload all of them.
CREATE FUNCTION capability_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM pg_notify('capability_changed', '{}');
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('capability_changed', json_build_object('name', OLD.name, 'version', OLD.version)::text);
    ELSE
        PERFORM pg_notify('capability_changed', json_build_object('name', NEW.name, 'version', NEW.version)::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER capability_changed AFTER INSERT OR UPDATE OR DELETE ON capabilities
    FOR EACH ROW EXECUTE FUNCTION capability_changed();
CREATE TRIGGER capability_truncated AFTER TRUNCATE ON capabilities
    FOR EACH STATEMENT EXECUTE FUNCTION capability_changed();
