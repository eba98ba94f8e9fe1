-- The bot's processes on this database, for /status (this process and the whole fleet). Each process upserts
-- its row every FLEET_BEAT_S and deletes it on a clean stop; a beat also deletes rows not seen for a day (a
-- process that was killed). No user data: where the process runs, its version and its adapters' states.
CREATE TABLE processes (
    id text PRIMARY KEY,                     -- host:pid:random, made once per process
    host text NOT NULL,
    pid integer NOT NULL,
    version text NOT NULL,
    adapters text[] NOT NULL DEFAULT '{}',   -- "telegram (@bot)", "discord (… shards 0,1 of 4)"
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at timestamptz NOT NULL DEFAULT now()  -- the database's clock, so hosts with skewed clocks agree
);
