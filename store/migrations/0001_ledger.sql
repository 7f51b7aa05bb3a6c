-- Accounts, API keys, credits, top-ups and the message ledger.
-- Credits are integers; the CHECKs are the last line of defence behind the statements that
-- reserve and settle: a balance can never go negative nor hold more than it owns.

CREATE TABLE accounts (
    id text PRIMARY KEY,
    name text NOT NULL UNIQUE,
    status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended')),
    -- apiCredits owned, reservations included.
    balance bigint NOT NULL DEFAULT 0 CHECK (balance >= 0),
    -- Credits held by turns in flight.
    reserved bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0 AND reserved <= balance),
    lifetime_top_up_cents bigint NOT NULL DEFAULT 0 CHECK (lifetime_top_up_cents >= 0),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id text PRIMARY KEY,
    account_id text NOT NULL REFERENCES accounts (id),
    name text NOT NULL,
    prefix text NOT NULL,
    hash bytea NOT NULL UNIQUE,
    kind text NOT NULL CHECK (kind IN ('api', 'cli')),
    scopes text[] NOT NULL DEFAULT '{}',
    tier text NOT NULL,
    revoked_at timestamptz NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX api_keys_account ON api_keys (account_id);

CREATE TABLE top_ups (
    reference text NOT NULL UNIQUE,
    account_id text NOT NULL REFERENCES accounts (id),
    usd_cents bigint NOT NULL CHECK (usd_cents > 0),
    credits bigint NOT NULL CHECK (credits >= 0),
    status text NOT NULL CHECK (status IN ('pending', 'confirmed')),
    created_at timestamptz NOT NULL DEFAULT now(),
    confirmed_at timestamptz NULL,
    CHECK ((status = 'confirmed') = (confirmed_at IS NOT NULL))
);
CREATE INDEX top_ups_account ON top_ups (account_id);

-- Gateway processes alive, so the reaper can tell an orphaned reservation from a long turn.
CREATE TABLE gateway_instances (
    id text PRIMARY KEY,
    heartbeat_at timestamptz NOT NULL
);

-- The message ledger: one row per turn, written at reserve and completed at settle.
CREATE TABLE messages (
    id text PRIMARY KEY,
    account_id text NOT NULL REFERENCES accounts (id),
    key_id text NOT NULL,
    model text NOT NULL,
    served_model text NOT NULL,
    provider text NOT NULL,
    upstream text NOT NULL,
    upstream_model text NOT NULL,
    endpoint text NOT NULL,
    stream boolean NOT NULL,
    status text NOT NULL,
    reserved bigint NOT NULL CHECK (reserved >= 0),
    billed bigint NOT NULL DEFAULT 0 CHECK (billed >= 0 AND billed <= reserved),
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cache_creation_input_tokens bigint NOT NULL DEFAULT 0,
    cache_read_input_tokens bigint NOT NULL DEFAULT 0,
    stop_reason text NULL,
    -- The gateway process holding the reservation.
    instance_id text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    settled_at timestamptz NULL,
    latency_ms bigint NULL
);
CREATE INDEX messages_account_created ON messages (account_id, created_at);
CREATE INDEX messages_open ON messages (instance_id) WHERE status = 'reserved';
