-- A photo that came with a message is stored like a document (sql/029): a quoted row, of kind `photo`, holding the
-- photo's mark ("[photo #12]", core/media/photos.py). Whatever the picture shows (a screenshot of someone's message,
-- text on a sign) is data, not the sender's instructions: a turn that holds it has no admin tools.
ALTER TABLE messages DROP CONSTRAINT messages_quoted_kind_check;
ALTER TABLE messages ADD CONSTRAINT messages_quoted_kind_check
    CHECK (quoted_kind IN ('forward', 'quote', 'reply', 'job', 'file', 'photo')) NOT VALID;
