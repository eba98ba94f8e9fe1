-- Store-and-claim in one round trip (issue 20): the process that receives an update takes it itself when its chat
-- has nothing else waiting or running, instead of storing it, being woken by the notification and claiming it.
-- Updates of one chat are stored one at a time (a transaction-scoped advisory lock on the chat), and the check for
-- an open update of the chat runs after that lock, in a snapshot of its own (plpgsql takes one per statement), so
-- two processes receiving updates of one chat at once never both take one: per-chat order holds across processes.
CREATE FUNCTION inbox_receive(p text, u bigint, ck text, pl jsonb, claimer text, lease_s float8)
RETURNS TABLE (stored boolean, owner text, attempts int, handed_back int, done boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    take boolean := false;
BEGIN
    PERFORM pg_advisory_xact_lock(20, hashtext(p || ':' || ck));
    IF claimer IS NOT NULL THEN
        take := NOT EXISTS (SELECT 1 FROM inbox j WHERE j.platform = p AND j.chat_key = ck AND j.done_at IS NULL);
    END IF;
    RETURN QUERY
        INSERT INTO inbox AS i (platform, update_id, chat_key, payload, owner, lease_until, attempts)
        VALUES (p, u, ck, pl, CASE WHEN take THEN claimer END,
                CASE WHEN take THEN now() + make_interval(secs => lease_s) END, CASE WHEN take THEN 1 ELSE 0 END)
        ON CONFLICT (platform, update_id) DO NOTHING
        RETURNING true, i.owner, i.attempts, i.handed_back, false;
    IF NOT FOUND THEN  -- stored before (a redelivery): say who holds it, so a claim whose answer was lost is found
        RETURN QUERY SELECT false, i.owner, i.attempts, i.handed_back, i.done_at IS NOT NULL
            FROM inbox i WHERE i.platform = p AND i.update_id = u;
    END IF;
END
$$;

-- Only an update nobody took on arrival needs to wake the processes.
DROP TRIGGER inbox_stored ON inbox;
CREATE TRIGGER inbox_stored AFTER INSERT ON inbox FOR EACH ROW WHEN (NEW.owner IS NULL)
    EXECUTE FUNCTION inbox_stored();
