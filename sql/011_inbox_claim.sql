-- The inbox claim (core/storage/inbox.py): lease up to n updates that may run now, oldest first.
-- An update is claimable only while no older update of its chat is open and no other update of its chat is
-- leased, so a chat's updates run one at a time and in order (also when a late webhook brings an older one while
-- a newer one runs); SKIP LOCKED lets processes claim side by side. The rows of one chat exclude each other in
-- the same snapshot, so a batch never holds two updates of one chat.
-- It is a function for its `SET enable_sort = off`: the claim must walk the open updates from the oldest and
-- stop at n. With statistics that say few updates are open (a fresh table, or two days of handled ones), the
-- planner otherwise checks every open update and sorts them all: a claim took 9.5 ms with 3,000 waiting instead
-- of 0.7 ms (bench/inbox_backlog.py), paid at every claim exactly while a backlog is being worked off.
CREATE FUNCTION inbox_claim(platforms text[], claimer text, lease_s float8, n int)
RETURNS TABLE (platform text, update_id bigint, chat_key text, payload jsonb, attempts int, waited float8)
LANGUAGE sql SET enable_sort = off AS $$
UPDATE inbox SET owner = claimer, lease_until = now() + make_interval(secs => lease_s), attempts = inbox.attempts + 1
WHERE (inbox.platform, inbox.update_id) IN (
    SELECT i.platform, i.update_id FROM inbox i
    WHERE i.done_at IS NULL AND i.platform = ANY(platforms)
        AND (i.lease_until IS NULL OR i.lease_until < now())
        AND NOT EXISTS (
            SELECT 1 FROM inbox j
            WHERE j.platform = i.platform AND j.chat_key = i.chat_key AND j.done_at IS NULL
                AND j.update_id <> i.update_id AND (j.update_id < i.update_id OR j.lease_until >= now()))
    ORDER BY i.update_id
    LIMIT n
    FOR UPDATE SKIP LOCKED)
RETURNING inbox.platform, inbox.update_id, inbox.chat_key, inbox.payload, inbox.attempts,
    extract(epoch FROM now() - inbox.received_at)::float8
$$;
