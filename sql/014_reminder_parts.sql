-- How many parts of a reminder the platform has accepted, and the text they were cut from. An adapter counts
-- each part right after it is sent, so a retry (this process or another after the lease) sends only the parts
-- that are missing, cut from the same text (a plain reminder's wording and an agent job's answer would differ
-- on a second build). The text is kept only while the occurrence is open.
ALTER TABLE occurrences ADD COLUMN sent_parts integer NOT NULL DEFAULT 0;
ALTER TABLE occurrences ADD COLUMN sent_text text;
