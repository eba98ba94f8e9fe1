-- What people send besides text (core/media/store.py): voice notes, audio, photos, documents, stickers. An attachment
-- belongs to the account that sent it (it moves with the account on /link, goes with it on /forget_me) and to the chat
-- it came in (deleted with it). What the bot keeps is what it made of the file: a photo resized for the model, a
-- document's extracted pages, a voice note's transcript; the platform's own reference to the file is kept too, so
-- nothing is lost when processing failed. `size_bytes` counts against the account's storage cap.
CREATE TABLE attachments (
    id           bigserial PRIMARY KEY,
    account_id   bigint NOT NULL REFERENCES accounts(id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    identity_id  bigint REFERENCES users(id) ON DELETE SET NULL,         -- who sent it
    chat_id      bigint REFERENCES chats(id) ON DELETE CASCADE,
    turn_id      bigint REFERENCES turns(id) ON DELETE SET NULL,
    kind         text NOT NULL CHECK (kind IN ('voice', 'audio', 'photo', 'document', 'sticker')),
    name         text NOT NULL DEFAULT '',                              -- the file's name, or a caption
    mime         text,
    platform_ref text,                                                  -- e.g. a Telegram file_id
    size_bytes   bigint NOT NULL DEFAULT 0 CHECK (size_bytes >= 0),     -- of what is stored here
    data         bytea,                                                 -- a prepared image
    pages        text[],                                                -- a document's text, a transcript
    total_pages  int,
    created_at   timestamptz NOT NULL
);
CREATE INDEX attachments_account ON attachments (account_id, id DESC);
CREATE INDEX attachments_chat ON attachments (chat_id, id DESC);
