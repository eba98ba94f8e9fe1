-- Reminder retries: a transiently failed occurrence stays 'claimed' with lease_until as its next attempt and
-- error as the last failure; 'failed' now means refused for good or not delivered within the grace window.
-- /status counts recent failures.

CREATE INDEX occurrences_failed ON occurrences (scheduled_at) WHERE status = 'failed';
