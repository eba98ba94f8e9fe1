-- Calls to a tool that changes things, of an untrusted MCP server, parked until the person who was asked allows them
-- (core/mcp_servers/confirm.py): a button under the answer, or /mcp allow <id>. Only the identity that was asked may
-- allow it, once, before it expires; `refused`: it could not be run any more (the tool or the person's access gone).
CREATE TABLE mcp_confirmations (
    id          bigserial PRIMARY KEY,
    account_id  bigint NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    identity_id bigint NOT NULL REFERENCES users(id) ON DELETE CASCADE,   -- who was asked (and only they may allow)
    chat_id     bigint NOT NULL REFERENCES chats(id) ON DELETE CASCADE,   -- where the call was asked for
    server      text NOT NULL,
    tool        text NOT NULL,                                            -- the server's own name of the tool
    arguments   jsonb NOT NULL,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    state       text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'done', 'refused'))
);
CREATE INDEX mcp_confirmations_account ON mcp_confirmations (account_id);
