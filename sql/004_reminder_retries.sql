-- Reminder retries: a transiently failed occurrence stays 'claimed' with lease_until as its next attempt and
-- error as the last failure; 'failed' now means refused for good or not delivered within the grace window.
-- /status counts recent failures.

CREATE INDEX occurrences_failed ON occurrences (scheduled_at) WHERE status = 'failed';
-- The sweep moves open cron tasks whose owner changed zone; this keeps that query off the one-shot tasks.
CREATE INDEX tasks_cron_open ON tasks (due_at)
    WHERE recurrence->>'kind' = 'cron' AND status IN ('pending', 'in_progress');
