-- The model an account chose with /model (issue 21): an entry of LLM_MODELS as /model names it (`gpt-4o`,
-- `groq:llama-3.3-70b-versatile`); NULL = the bot's default (LLM_MODEL). Every linked identity shares it. A name
-- the operator no longer lists stays stored (/model says so) while the default answers.
ALTER TABLE accounts ADD COLUMN model text;
