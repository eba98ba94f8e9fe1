-- The tools of each MCP server as an admin accepted them (core/mcp_servers/hub.py): a hash of a tool's name,
-- description and input schema. A server's first tool list is accepted as it is; a tool that is new later, or whose
-- hash changed (`seen` differs from `pinned`), is not offered until an admin accepts it (/mcp accept <server>).
CREATE TABLE mcp_tool_pins (
    server     text NOT NULL,
    tool       text NOT NULL,
    pinned     text,                 -- the accepted hash (NULL: never accepted)
    seen       text NOT NULL,        -- the hash last listed
    first_seen timestamptz NOT NULL,
    changed_at timestamptz,
    PRIMARY KEY (server, tool)
);
