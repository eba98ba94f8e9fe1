-- Capability queries see a speaker's tasks as manage_tasks does: in a group, or in a turn with someone else's text
-- in it, only the tasks of that chat (a group must not read the speaker's private reminders through a capability).
-- The bot sets `app.task_chat` (empty: all of the speaker's tasks) with a signature over the user id and the chat;
-- a query can change the setting, not sign it, and a wrong signature scopes to no chat at all.
CREATE FUNCTION capability_task_chat() RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT CASE WHEN current_setting('app.task_chat_sig', true)
                     = capability_sign(current_setting('app.user_id', true) || ':chat:'
                                       || coalesce(current_setting('app.task_chat', true), ''))
                THEN nullif(current_setting('app.task_chat', true), '')::bigint
                ELSE -1 END
$$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'assistant_capability_reader') THEN
        DROP POLICY IF EXISTS capability_reader_own ON tasks;
        CREATE POLICY capability_reader_own ON tasks FOR SELECT TO assistant_capability_reader
            USING (user_id = capability_user_id() AND (capability_task_chat() IS NULL OR chat_id = capability_task_chat()));
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'capabilities: cannot change the tasks reader policy (%); non-admin capability queries see no tasks', SQLERRM;
END
$$;
