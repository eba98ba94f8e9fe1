-- The HTTP API's sessions (core/sessions.py): chats of platform 'api', each owned by the identity that made it (a
-- token's or a web sign-in's identity); its account's other identities see it too, and it follows the identity across
-- /link and /unlink like the identity's tokens. /forget_me deletes the identities, and with them their sessions.
ALTER TABLE chats ADD COLUMN owner_id bigint REFERENCES users(id) ON DELETE CASCADE;
CREATE INDEX chats_owner ON chats (owner_id, id DESC) WHERE owner_id IS NOT NULL;

-- A reminder delivered into a session is stored there as a message of its own role: the session's history shows it,
-- but it is never replayed to the model (like a reminder in a Telegram chat) and never searched.
ALTER TABLE messages DROP CONSTRAINT messages_role_check;
ALTER TABLE messages ADD CONSTRAINT messages_role_check CHECK (role IN ('user', 'assistant', 'tool', 'reminder'))
    NOT VALID;
