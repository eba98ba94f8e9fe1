-- The inbox answers each update once, in order, even when a lease is lost (issue 19).

-- Leases handed back at shutdown (a rolling deploy): a clean hand-back is not a failed attempt, so an update is
-- given up only when processes died (or lost their lease) while handling it: attempts - handed_back.
ALTER TABLE inbox ADD COLUMN handed_back int NOT NULL DEFAULT 0;

-- The claim (sql/011) returns handed_back too, and a process never claims an update whose lease it held itself
-- (one whose lease ran out while its own handler still runs: that handler goes on with it, renewing again).
-- `attempts` goes up at each claim and never down: with the owner it names one lease, so renew, finish and
-- hand-back touch a row only while the process still holds it.
DROP FUNCTION inbox_claim(text[], text, float8, int);
CREATE FUNCTION inbox_claim(platforms text[], claimer text, lease_s float8, n int)
RETURNS TABLE (platform text, update_id bigint, chat_key text, payload jsonb, attempts int, waited float8,
               handed_back int)
LANGUAGE sql SET enable_sort = off AS $$
UPDATE inbox SET owner = claimer, lease_until = now() + make_interval(secs => lease_s), attempts = inbox.attempts + 1
WHERE (inbox.platform, inbox.update_id) IN (
    SELECT i.platform, i.update_id FROM inbox i
    WHERE i.done_at IS NULL AND i.platform = ANY(platforms)
        AND (i.lease_until IS NULL OR i.lease_until < now()) AND i.owner IS DISTINCT FROM claimer
        AND NOT EXISTS (
            SELECT 1 FROM inbox j
            WHERE j.platform = i.platform AND j.chat_key = i.chat_key AND j.done_at IS NULL
                AND j.update_id <> i.update_id AND (j.update_id < i.update_id OR j.lease_until >= now()))
    ORDER BY i.update_id
    LIMIT n
    FOR UPDATE SKIP LOCKED)
RETURNING inbox.platform, inbox.update_id, inbox.chat_key, inbox.payload, inbox.attempts,
    extract(epoch FROM now() - inbox.received_at)::float8, inbox.handed_back
$$;

-- An error answer ("the model could not be used") is the turn's answer: a redelivered update sends it (unless it
-- went out) instead of asking the model again. Kept on the turn, not as a message: the model never sees it replayed
-- as its own words.
ALTER TABLE turns ADD COLUMN error_code text;
ALTER TABLE turns ADD COLUMN error_message text;
