-- Retention (core/storage/retention.py): each process deletes, every few minutes, ended reminder occurrences
-- older than RETENTION_DAYS and refusal notices older than a day. These indexes let a prune find the oldest
-- such rows without reading the whole table (the claimed occurrences, still being delivered, are never pruned).
CREATE INDEX occurrences_ended ON occurrences (scheduled_at) WHERE status <> 'claimed';
CREATE INDEX refusal_notices_told ON refusal_notices (told_at);
