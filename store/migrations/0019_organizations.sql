-- Organizations (docs/dashboard.md, "Organizations and roles"): an account is owned by the
-- dashboard users whose `account_id` it is, each with a role. Every user of before this
-- migration was the one user of their account: its owner. The default stays for pods of the
-- previous release during a rolling update, whose sign-ups make owners too.
ALTER TABLE dashboard_users ADD COLUMN role text NOT NULL DEFAULT 'owner'
    CHECK (role IN ('owner', 'admin', 'developer', 'billing'));

-- Invitations to join an account's organization: only the SHA-256 of the mailed link's token
-- is kept. Single use (the row is deleted when accepted), for the invited email only.
CREATE TABLE dashboard_invitations (
    token_hash bytea PRIMARY KEY,
    account_id text NOT NULL REFERENCES accounts (id),
    email text NOT NULL,
    role text NOT NULL CHECK (role IN ('owner', 'admin', 'developer', 'billing')),
    invited_by text NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX dashboard_invitations_account ON dashboard_invitations (account_id, created_at);
CREATE INDEX dashboard_invitations_expiry ON dashboard_invitations (expires_at);

-- Who created a key from the dashboard (a user id): a developer sees and revokes only theirs.
-- Keys of before, and of the admin API, CLI and manifests, have none.
ALTER TABLE api_keys ADD COLUMN created_by text NULL;
