-- Domain claims take effect only once proven (docs/dashboard.md, "Single sign-on"):
-- `dashboard_domains` keeps holding the proven claims, the ones every release acts on (at most
-- one organization per domain), so the previous release, which reads it alone, never acts on
-- an unproven claim. Claims made before proofs existed were made by an owner whose own address
-- at the domain was verified at sign-up: they stay proven, as `sign_up`.
ALTER TABLE dashboard_domains ADD COLUMN proof text NOT NULL DEFAULT 'sign_up';
-- The random part of the TXT record that proved the claim, re-checked daily.
ALTER TABLE dashboard_domains ADD COLUMN txt_token text;
-- Since when the re-check has not found the record; the claim lapses after the grace period.
ALTER TABLE dashboard_domains ADD COLUMN missing_since timestamptz;

-- Pending claims: any number of organizations may hold one for a domain, until one proves it.
-- A proof link mailed to an address at the domain is kept only as the SHA-256 of its token,
-- spent when followed.
CREATE TABLE dashboard_pending_domains (
    domain text NOT NULL,
    account_id text NOT NULL REFERENCES accounts (id),
    require_sso boolean NOT NULL,
    claimed_at timestamptz NOT NULL,
    txt_token text NOT NULL,
    mail_to text,
    mail_token_hash bytea UNIQUE,
    mail_expires_at timestamptz,
    PRIMARY KEY (domain, account_id)
);
CREATE INDEX dashboard_pending_domains_account ON dashboard_pending_domains (account_id);
