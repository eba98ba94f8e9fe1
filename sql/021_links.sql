-- Linking identities into one account (core/accounts.py): `/link` in a private chat makes a one-time code, `/link
-- CODE` sent by another identity merges that identity's account into the code's. Only a hash of a code is stored.
-- Times come from the bot's (injectable) clock, passed in as parameters.
CREATE TABLE link_codes (
    code_sha256 bytea PRIMARY KEY,                                            -- sha256 of the normalised code
    account_id  bigint NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,    -- the account the code joins into
    issued_by   bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,       -- the identity that asked for it
    chat_id     bigint REFERENCES chats(id) ON DELETE SET NULL,               -- its private chat: told there
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz,
    used_by     bigint REFERENCES users(id) ON DELETE SET NULL
);
CREATE INDEX link_codes_issued_by ON link_codes (issued_by, created_at);
CREATE INDEX link_codes_account ON link_codes (account_id);
CREATE INDEX link_codes_expires ON link_codes (expires_at);

-- Wrong codes per trying identity (counted here, so across processes): too many within the lock time lock linking
-- for that identity until `locked_until`. The row is also the identity's lock: its tries run one at a time.
CREATE TABLE link_tries (
    user_id        bigint PRIMARY KEY REFERENCES users(id) ON DELETE CASCADE,
    wrong          int NOT NULL DEFAULT 0,   -- wrong codes since first_wrong_at
    first_wrong_at timestamptz,
    locked_until   timestamptz
);
