-- Signing in to the web chat page without a password (core/web_signin.py): `/web` in a private chat makes a one-time
-- link (10 minutes, once); opening it makes a web sign-in, whose secret lives only in the browser's cookie. Both belong
-- to an identity (a sign-in acts for that identity's account at the time of use, so it follows /link and /unlink like
-- an API token) and go with it (/forget_me). Only sha256 hashes of codes and cookie secrets are stored. Times come
-- from the bot's (injectable) clock, passed in as parameters.
CREATE TABLE web_links (
    id          bigserial PRIMARY KEY,
    code_hash   bytea NOT NULL UNIQUE,                                   -- sha256 of the link's code
    identity_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,  -- who asked for it (/web)
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    used_at     timestamptz                                              -- set once, by the one redeem that wins
);
CREATE INDEX web_links_identity ON web_links (identity_id, created_at);
CREATE INDEX web_links_expires ON web_links (expires_at);

CREATE TABLE web_signins (
    id            bigserial PRIMARY KEY,
    secret_hash   bytea NOT NULL UNIQUE,                                   -- sha256 of the cookie's secret
    identity_id   bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,  -- who it signs in as
    -- the page's CSRF token, kept as is: it is worth nothing without the cookie (which only its hash here matches),
    -- and the page may be given it again on every load
    csrf          text NOT NULL,
    created_at    timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    signed_out_at timestamptz
);
CREATE INDEX web_signins_identity ON web_signins (identity_id, created_at);
CREATE INDEX web_signins_expires ON web_signins (expires_at);
