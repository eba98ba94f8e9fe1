-- Per-account bearer tokens (core/api_tokens.py): `/token new NAME` in a private chat, or `bot token`, makes one; it
-- speaks as the identity that made it (admin rights stay per identity) for that identity's account. Only a sha256 of
-- the secret is stored: the secret is shown once. Times come from the bot's (injectable) clock, passed in.
CREATE TABLE api_tokens (
    id           bigserial PRIMARY KEY,
    -- the identity's account now: kept in step when the identity moves (/link, /unlink; the trigger below)
    account_id   bigint NOT NULL REFERENCES accounts(id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    identity_id  bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,   -- who the token speaks as
    name         text NOT NULL,
    token_hash   bytea NOT NULL UNIQUE,                                     -- sha256 of the secret
    created_at   timestamptz NOT NULL,
    last_used_at timestamptz,
    revoked_at   timestamptz
);
CREATE UNIQUE INDEX api_tokens_live_name ON api_tokens (account_id, name) WHERE revoked_at IS NULL;
CREATE INDEX api_tokens_identity ON api_tokens (identity_id);

-- A token follows its identity: when the identity joins another account (/link) or gets one of its own (/unlink), its
-- tokens go with it (before the account left behind is deleted, which would delete them). A live token whose name the
-- new account already uses gets its id appended (`laptop-12`), so a link never fails on a name.
CREATE FUNCTION api_tokens_follow_identity() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE api_tokens t SET account_id = NEW.account_id,
        name = CASE WHEN t.revoked_at IS NULL AND EXISTS (
                        SELECT 1 FROM api_tokens o WHERE o.account_id = NEW.account_id AND o.name = t.name
                          AND o.revoked_at IS NULL AND o.identity_id <> NEW.id)
                    THEN t.name || '-' || t.id ELSE t.name END
    WHERE t.identity_id = NEW.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER api_tokens_follow_identity AFTER UPDATE OF account_id ON users
    FOR EACH ROW WHEN (OLD.account_id IS DISTINCT FROM NEW.account_id) EXECUTE FUNCTION api_tokens_follow_identity();
