-- Single sign-on (docs/dashboard.md, "Single sign-on"): an organization claims an email
-- domain, once across all organizations; a new user signing in through the provider with a
-- verified email of that domain joins it. `require_sso` refuses password sign-in to the
-- domain's emails.
CREATE TABLE dashboard_domains (
    domain text PRIMARY KEY,
    account_id text NOT NULL REFERENCES accounts (id),
    require_sso boolean NOT NULL,
    claimed_at timestamptz NOT NULL
);
CREATE INDEX dashboard_domains_account ON dashboard_domains (account_id);

-- Sign-ins started at the provider and not come back yet: only the SHA-256 of the `state`
-- the browser's cookie holds. Deleted when the callback comes (single use) or past expiry.
CREATE TABLE dashboard_sso_logins (
    state_hash bytea PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
CREATE INDEX dashboard_sso_logins_expiry ON dashboard_sso_logins (expires_at);
