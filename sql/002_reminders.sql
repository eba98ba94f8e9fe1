-- Reminders: agent jobs, and one row per occurrence (task, scheduled time) claimed before it is sent.

ALTER TABLE tasks ADD COLUMN kind text NOT NULL DEFAULT 'reminder' CHECK (kind IN ('reminder', 'agent'));
ALTER TABLE tasks ADD COLUMN agent_prompt text;  -- agent jobs: what the agent does when due

CREATE TABLE occurrences (
    task_id             bigint NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
    scheduled_at        timestamptz NOT NULL,
    status              text NOT NULL DEFAULT 'claimed'
                        CHECK (status IN ('claimed', 'delivered', 'failed', 'skipped')),
    claimed_by          text,
    lease_until         timestamptz,           -- a claim older than this was left by a dead process
    attempts            int NOT NULL DEFAULT 1,
    late                boolean NOT NULL DEFAULT false,
    ran_at              timestamptz,           -- the message was built (agent turn ran)
    delivered_at        timestamptz,           -- the platform accepted it
    error               text,
    platform_message_id text,
    PRIMARY KEY (task_id, scheduled_at)
);
CREATE INDEX occurrences_claimed ON occurrences (lease_until) WHERE status = 'claimed';
