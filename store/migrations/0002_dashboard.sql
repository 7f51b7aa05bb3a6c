-- The dashboard's own records in cluster mode, shared by every pod: users (one per account),
-- their sessions (only a hash of the cookie's token), failed sign-ins for throttling, and the
-- checkouts started from the billing page.
CREATE TABLE dashboard_users (
    id text PRIMARY KEY,
    email text NOT NULL UNIQUE,
    password_hash text NOT NULL,
    account_id text NOT NULL REFERENCES accounts (id),
    created_at timestamptz NOT NULL
);

CREATE TABLE dashboard_sessions (
    token_hash bytea PRIMARY KEY,
    user_id text NOT NULL REFERENCES dashboard_users (id) ON DELETE CASCADE,
    csrf text NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX dashboard_sessions_expiry ON dashboard_sessions (expires_at);

CREATE TABLE dashboard_sign_in_failures (
    email text PRIMARY KEY,
    failures integer NOT NULL,
    window_ends timestamptz NOT NULL
);

CREATE TABLE dashboard_checkouts (
    reference text PRIMARY KEY,
    account_id text NOT NULL REFERENCES accounts (id),
    usd_cents bigint NOT NULL CHECK (usd_cents > 0),
    status text NOT NULL CHECK (status IN ('pending', 'failed')),
    created_at timestamptz NOT NULL
);
CREATE INDEX dashboard_checkouts_by_account ON dashboard_checkouts (account_id, created_at DESC);
