-- Credits granted once per reference (a dashboard sign-up's credits: `signup:<user id>`), so
-- that a grant asked for again after a crash, or twice at once, credits the account once.
CREATE TABLE ledger_grants (
    reference text PRIMARY KEY,
    account_id text NOT NULL REFERENCES accounts (id),
    credits bigint NOT NULL CHECK (credits >= 0),
    granted_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_grants_account ON ledger_grants (account_id);

-- Sign-ups whose credits were granted before this table: those verified since 0009, and those
-- made before 0009 (credited at sign-up, then asked to verify). Their amount is not known here
-- (0); the balance already holds it.
INSERT INTO ledger_grants (reference, account_id, credits)
SELECT 'signup:' || u.id, u.account_id, 0
FROM dashboard_users u
WHERE u.email_verified_at IS NOT NULL
   OR u.created_at < (SELECT installed_on FROM _sqlx_migrations WHERE version = 9);
