-- Credentials (docs/credentials.md): several named API keys per user with an optional expiry, disabled users, and
-- rotating token signing keys.

-- A key's public id is the first 16 hex digits of its hash: the id the audit trail already records
-- (domain.audit.api_key_id) and the ``akid`` claim of the tokens it buys.
ALTER TABLE api_keys
    ADD COLUMN id           text GENERATED ALWAYS AS (left(key_hash, 16)) STORED,
    ADD COLUMN name         text NOT NULL DEFAULT 'default',
    ADD COLUMN expires_at   timestamptz,
    ADD COLUMN created_by   uuid,
    ADD COLUMN last_used_at timestamptz;
CREATE UNIQUE INDEX api_keys_id ON api_keys (id);
-- the revocation list every replica reloads: keys revoked within the last token TTL
CREATE INDEX api_keys_revoked ON api_keys (revoked_at) WHERE revoked_at IS NOT NULL;

-- disabled_at: no token while set. tokens_not_before: stamped when disabled, kept when enabled again, so tokens
-- issued before the disabling stay refused (until they expire).
ALTER TABLE users
    ADD COLUMN disabled_at       timestamptz,
    ADD COLUMN tokens_not_before timestamptz;
CREATE INDEX users_tokens_not_before ON users (tokens_not_before) WHERE tokens_not_before IS NOT NULL;

-- Token signing keys: only ids and times; a key's secret is HMAC-SHA256(TESSERA_TOKEN_SECRET, kid). The current
-- key (retired_at NULL, at most one) signs; a retired key verifies until its last token expires.
CREATE TABLE signing_keys (
    kid         text PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now(),
    retired_at  timestamptz
);
CREATE UNIQUE INDEX signing_keys_one_current ON signing_keys ((true)) WHERE retired_at IS NULL;
