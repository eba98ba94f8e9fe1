-- How many parts of a turn's answer the platform has accepted. An adapter that takes updates from the inbox
-- (Telegram) counts each part right after it is sent, so a process that takes the update again after a
-- dead one sends only the parts that are missing (Telegram has no idempotency key to ask with).
ALTER TABLE turns ADD COLUMN sent_parts integer NOT NULL DEFAULT 0;
