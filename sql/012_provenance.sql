-- Stored text keeps where it came from.

-- Someone else's text that came with a user's message (a forward, a quote, a reply from another chat) is stored as
-- its own user-role row with its kind and origin; the replay shows it as quoted data, and a turn whose context holds
-- such a row has no admin tools. `job`: the prompt of a scheduled job that was written with others' text around.
ALTER TABLE messages ADD COLUMN quoted_kind text CHECK (quoted_kind IN ('forward', 'quote', 'reply', 'job'));
ALTER TABLE messages ADD COLUMN quoted_origin text;

-- Others' words do not teach the speaker's search words (sql/006).
DROP TRIGGER messages_learn_words ON messages;
CREATE TRIGGER messages_learn_words AFTER INSERT ON messages FOR EACH ROW
    WHEN (NEW.role = 'user' AND NEW.content IS NOT NULL AND NEW.quoted_kind IS NULL)
    EXECUTE FUNCTION messages_learn_words();

-- Whether a task (its title, details and job prompt) was written or last changed in a turn whose context held only
-- its owner's own words. A job that was not runs without admin and memory tools, wherever it is delivered. Plain
-- reminders are only shown; agent jobs written before this column existed have an unknown origin: not trusted until
-- their owner saves them again in a private chat.
ALTER TABLE tasks ADD COLUMN own_words boolean NOT NULL DEFAULT false;
UPDATE tasks SET own_words = (kind = 'reminder');

-- Message rate limits count the turns a user (and a chat) started in the last minute.
CREATE INDEX turns_user_started ON turns (user_id, started_at);
CREATE INDEX turns_chat_started ON turns (chat_id, started_at);
