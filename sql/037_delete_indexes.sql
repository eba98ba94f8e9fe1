-- What bench/big_db.py found (issue 35): a foreign key's ON DELETE action runs, for each deleted row, one statement on
-- the referencing table by that column; without an index there it reads the whole table. Deleting an identity
-- (/forget_me, an unlink that empties an account) set messages.user_id and tasks.created_by to NULL by reading every
-- message and every task, once per identity; deleting a private chat read every task (tasks.chat_id) and deleting a
-- turn every attachment (attachments.turn_id). Partial: only rows that point somewhere are ever looked up.
CREATE INDEX messages_user ON messages (user_id) WHERE user_id IS NOT NULL;
CREATE INDEX tasks_created_by ON tasks (created_by) WHERE created_by IS NOT NULL;
CREATE INDEX tasks_chat ON tasks (chat_id) WHERE chat_id IS NOT NULL;
CREATE INDEX attachments_turn ON attachments (turn_id) WHERE turn_id IS NOT NULL;
CREATE INDEX attachments_identity ON attachments (identity_id) WHERE identity_id IS NOT NULL;

-- Retention's pass over ended occurrences (core/storage/retention.py) reads them in (scheduled_at, task_id) order from
-- where its last batch stopped; this replaces sql/016's index on scheduled_at alone.
CREATE INDEX occurrences_ended_key ON occurrences (scheduled_at, task_id) WHERE status <> 'claimed';
DROP INDEX occurrences_ended;
