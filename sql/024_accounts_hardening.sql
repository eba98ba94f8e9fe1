-- Accounts hardening (issue 21). A capability query's signed settings (app.user_sig, app.personal_sig,
-- app.task_chat_sig: sql/003, 015, 017) are readable by the query itself. Before accounts, a signature only ever named
-- its reader; now an account is shared by linked identities and /unlink splits one off, which would keep the account's
-- signatures, and with them a query that sets them back could read the account's rows for ever. A signature now also
-- covers the transaction it was made in (the backend and the transaction's start time): the bot signs and the query
-- runs in one transaction (core/capabilities/runtime.py run_query), and a signature seen there is worth nothing later.
CREATE OR REPLACE FUNCTION capability_sign(uid text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT encode(sha256(convert_to(s.secret || ':' || uid || ':' || pg_backend_pid()::text || ':'
                                    || to_char(transaction_timestamp() AT TIME ZONE 'UTC', 'YYYYMMDDHH24MISSUS')
                                    || ':' || s.secret, 'UTF8')), 'hex')
    FROM capability_secret s
$$;
REVOKE ALL ON FUNCTION capability_sign(text) FROM PUBLIC;
