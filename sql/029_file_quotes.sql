-- A document's text that came with a message is stored like others' words (sql/012): a quoted row of kind `file`,
-- whose origin is the file's name. Whoever wrote the file, its text is data, not the sender's instructions: a turn
-- that holds it has no admin tools.
ALTER TABLE messages DROP CONSTRAINT messages_quoted_kind_check;
ALTER TABLE messages ADD CONSTRAINT messages_quoted_kind_check
    CHECK (quoted_kind IN ('forward', 'quote', 'reply', 'job', 'file')) NOT VALID;
