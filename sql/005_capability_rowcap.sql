-- The row cap of capability queries is counted here, outside the query's text: the text was pasted into
-- `... FROM (%s) r LIMIT %s`, so a query ending in `--` (or closing the parenthesis itself) dropped the
-- LIMIT. Now rows are fetched one by one and the loop stops after `max_rows`; the newline after the
-- pasted text keeps a trailing `--` comment from swallowing the wrapper's closing parenthesis.
CREATE OR REPLACE FUNCTION capability_rows(q text, args text[], max_rows int) RETURNS SETOF json
LANGUAGE plpgsql AS $$
DECLARE
    row_json json;
    n int := 0;
BEGIN
    IF max_rows IS NULL OR max_rows < 1 THEN
        RETURN;
    END IF;
    FOR row_json IN EXECUTE format(E'SELECT to_json(r) FROM (%s\n) r', q)
        USING args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8], args[9], args[10]
    LOOP
        RETURN NEXT row_json;
        n := n + 1;
        EXIT WHEN n >= max_rows;
    END LOOP;
END
$$;
