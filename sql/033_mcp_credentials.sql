-- Per-person credentials of MCP servers (`credentials: per_person` in MCP_CONFIG; core/mcp_servers/oauth.py): the
-- OAuth tokens and the client registration of one person (an account) at one server, as the `mcp` SDK's
-- OAuthClientProvider keeps them (its TokenStorage). Deleted with the account; moved by /link; /export lists the
-- servers only, never a token.
CREATE TABLE mcp_credentials (
    server       text NOT NULL,
    account_id   bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    tokens       jsonb,                  -- the SDK's OAuthToken (NULL: registered, not authorized yet)
    client_info  jsonb,                  -- the SDK's OAuthClientInformationFull (the dynamic registration)
    tokens_at    timestamptz,            -- when the tokens came (their expires_in counts from then)
    connected_at timestamptz,            -- when the person last finished /mcp connect
    updated_at   timestamptz NOT NULL,
    PRIMARY KEY (server, account_id)
);

-- An authorization link sent by /mcp connect, until its callback comes back (one use) or it expires. The PKCE
-- verifier stays in the SDK's flow, in the process that made the link.
CREATE TABLE mcp_oauth_pending (
    state      text PRIMARY KEY,         -- the OAuth `state` of the link
    server     text NOT NULL,
    account_id bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    expires_at timestamptz NOT NULL
);
CREATE INDEX mcp_oauth_pending_expires ON mcp_oauth_pending (expires_at);
