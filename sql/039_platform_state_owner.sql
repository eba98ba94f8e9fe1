-- What an adapter keeps about one person goes with them, and what is only worth keeping a while goes by itself
-- (issue 37): `owner` is the identity a row is about ('matrix:@ann:example.org': their direct room, a button only
-- they may press), deleted with /forget_me; `expires_at` ends a row's life (a message's buttons), deleted by retention.
ALTER TABLE platform_state ADD COLUMN owner text, ADD COLUMN expires_at timestamptz;
CREATE INDEX platform_state_owner ON platform_state (owner) WHERE owner IS NOT NULL;
CREATE INDEX platform_state_expires ON platform_state (expires_at) WHERE expires_at IS NOT NULL;
