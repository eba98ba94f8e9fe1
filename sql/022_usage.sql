-- Token usage and spending limits (issue 21; core/usage.py). Every model call adds its tokens to its account's row for
-- the day and the model: `day` is the account's local date when the call was made, so "today" and "this month" are a
-- handful of rows per model whatever the number of calls. There is deliberately no unique key: two processes that
-- add the first call of a day at once may make two rows for it (every reader sums), and merging accounts is a plain
-- `UPDATE token_usage SET account_id = <kept> WHERE account_id = <merged>`.
CREATE TABLE token_usage (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id        bigint NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    day               date   NOT NULL,            -- the account's local date of the calls
    model             text   NOT NULL,            -- the model the calls asked for (chat or embedding model)
    prompt_tokens     bigint NOT NULL DEFAULT 0,  -- input tokens, cached ones included
    completion_tokens bigint NOT NULL DEFAULT 0,
    cached_tokens     bigint NOT NULL DEFAULT 0,  -- of the prompt tokens, served from the server's cache (if it says)
    calls             integer NOT NULL DEFAULT 0
);
CREATE INDEX token_usage_account_day ON token_usage (account_id, day, model);  -- no token column: updates stay HOT

-- The whole bot's tokens per day of DEFAULT_TIMEZONE (BOT_DAILY_TOKENS, /status).
CREATE TABLE token_usage_bot (
    day               date PRIMARY KEY,
    prompt_tokens     bigint NOT NULL DEFAULT 0,
    completion_tokens bigint NOT NULL DEFAULT 0,
    cached_tokens     bigint NOT NULL DEFAULT 0,
    calls             integer NOT NULL DEFAULT 0
);

-- Model calls admitted under a budget and not recorded yet: each counts `tokens` against the budgets until its usage
-- is written (which deletes it) or `until` passes (its process died). Two calls of one account run at once only while
-- the budget has room for both at that size; nearer the limit they take turns, so no budget is passed by more than
-- one call, however many processes spend it.
CREATE TABLE token_reservations (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
    tokens     bigint NOT NULL,
    until      timestamptz NOT NULL
);
CREATE INDEX token_reservations_account ON token_reservations (account_id);

-- An admin's daily budget for one account (/budget); NULL: USER_DAILY_TOKENS.
ALTER TABLE accounts ADD COLUMN daily_tokens bigint CHECK (daily_tokens >= 0);

-- The check before a model call, and its admission in the same transaction: NULL when no budget applies (nothing is
-- reserved); {"ok": reservation id}; {"over": "day"|"month"|"bot", "used", "cap", "tz"} past a budget; {"busy": true}
-- when only calls in flight stand in the way (ask again when they are recorded); {"missing": true} when the account
-- is not there (yet: see below). Admissions of one account (of the
-- whole bot while BOT_DAILY_TOKENS is set) take turns on an advisory lock; the sums below run after it, in snapshots
-- of their own (plpgsql takes one per statement), so they see every admission that committed before.
CREATE FUNCTION usage_admit(account bigint, at timestamptz, default_tz text, user_day bigint, user_month bigint,
                            bot_day bigint, reserve bigint, lease interval)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    day_cap bigint;
    tz text;
    today date;
    used_day bigint;
    used_month bigint;
    used_bot bigint := 0;
    held bigint;
    held_bot bigint := 0;
    rid bigint;
BEGIN
    SELECT coalesce(a.daily_tokens, user_day), coalesce(a.timezone, default_tz) INTO day_cap, tz
        FROM accounts a WHERE a.id = account;
    IF NOT FOUND THEN  -- a new identity's account is made at the end of the statement that made it: ask again then
        RETURN CASE WHEN user_day IS NULL AND user_month IS NULL AND bot_day IS NULL THEN NULL
                    ELSE jsonb_build_object('missing', true) END;
    ELSIF day_cap IS NULL AND user_month IS NULL AND bot_day IS NULL THEN
        RETURN NULL;
    END IF;
    IF bot_day IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(23, 0);
    ELSE
        PERFORM pg_advisory_xact_lock(22, hashtext(account::text));
    END IF;
    today := (at AT TIME ZONE tz)::date;
    -- a row dated after today (the account moved west since) counts as today's
    SELECT coalesce(sum(u.prompt_tokens + u.completion_tokens) FILTER (WHERE u.day >= today), 0),
           coalesce(sum(u.prompt_tokens + u.completion_tokens), 0)
        INTO used_day, used_month
        FROM token_usage u WHERE u.account_id = account AND u.day >= date_trunc('month', today)::date;
    IF bot_day IS NOT NULL THEN
        SELECT coalesce(sum(b.prompt_tokens + b.completion_tokens), 0) INTO used_bot
            FROM token_usage_bot b WHERE b.day >= (at AT TIME ZONE default_tz)::date;
    END IF;
    IF user_month IS NOT NULL AND used_month >= user_month THEN
        RETURN jsonb_build_object('over', 'month', 'used', used_month, 'cap', user_month, 'tz', tz);
    ELSIF day_cap IS NOT NULL AND used_day >= day_cap THEN
        RETURN jsonb_build_object('over', 'day', 'used', used_day, 'cap', day_cap, 'tz', tz);
    ELSIF bot_day IS NOT NULL AND used_bot >= bot_day THEN
        RETURN jsonb_build_object('over', 'bot', 'used', used_bot, 'cap', bot_day, 'tz', tz);
    END IF;
    DELETE FROM token_reservations r WHERE r.until <= at AND (bot_day IS NOT NULL OR r.account_id = account);
    SELECT coalesce(sum(r.tokens), 0) INTO held FROM token_reservations r WHERE r.account_id = account;
    IF bot_day IS NOT NULL THEN
        SELECT coalesce(sum(r.tokens), 0) INTO held_bot FROM token_reservations r;
    END IF;
    IF (day_cap IS NOT NULL AND used_day + held >= day_cap) OR (user_month IS NOT NULL AND used_month + held >= user_month)
        OR (bot_day IS NOT NULL AND used_bot + held_bot >= bot_day) THEN
        RETURN jsonb_build_object('busy', true);
    END IF;
    INSERT INTO token_reservations (account_id, tokens, until) VALUES (account, reserve, at + lease) RETURNING id INTO rid;
    RETURN jsonb_build_object('ok', rid);
END
$$;

-- One model call's usage, written under the account its identity belongs to now (a link while the call ran moves it
-- along), and its reservation (if any) released in the same transaction.
CREATE FUNCTION usage_record(identity bigint, reservation bigint, at timestamptz, default_tz text, used_model text,
                             prompt bigint, completion bigint, cached bigint)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    account bigint;
    local_day date;
BEGIN
    IF reservation IS NOT NULL THEN
        DELETE FROM token_reservations WHERE id = reservation;
    END IF;
    SELECT u.account_id, (at AT TIME ZONE coalesce(a.timezone, default_tz))::date INTO account, local_day
        FROM users u JOIN accounts a ON a.id = u.account_id WHERE u.id = identity;
    IF NOT FOUND THEN  -- the identity is gone (/forget_me while the call ran): nothing to keep
        RETURN;
    END IF;
    UPDATE token_usage SET prompt_tokens = prompt_tokens + prompt, completion_tokens = completion_tokens + completion,
        cached_tokens = cached_tokens + cached, calls = calls + 1
        WHERE id = (SELECT t.id FROM token_usage t
                    WHERE t.account_id = account AND t.day = local_day AND t.model = used_model LIMIT 1);
    IF NOT FOUND THEN
        INSERT INTO token_usage (account_id, day, model, prompt_tokens, completion_tokens, cached_tokens, calls)
            VALUES (account, local_day, used_model, prompt, completion, cached, 1);
    END IF;
    INSERT INTO token_usage_bot AS b (day, prompt_tokens, completion_tokens, cached_tokens, calls)
        VALUES ((at AT TIME ZONE default_tz)::date, prompt, completion, cached, 1)
        ON CONFLICT (day) DO UPDATE SET prompt_tokens = b.prompt_tokens + EXCLUDED.prompt_tokens,
            completion_tokens = b.completion_tokens + EXCLUDED.completion_tokens,
            cached_tokens = b.cached_tokens + EXCLUDED.cached_tokens, calls = b.calls + 1;
END
$$;
