-- Voice answers (issue 23): with /voice on, an account's voice notes are also answered with a voice note (the answer
-- read aloud through SPEECH_MODEL); off by default. Every linked identity shares it; a /link keeps the code's
-- account's setting (like its model), an /unlink starts the separated identity with it off.
ALTER TABLE accounts ADD COLUMN voice_answers boolean NOT NULL DEFAULT false;
