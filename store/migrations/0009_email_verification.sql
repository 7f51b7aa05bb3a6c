-- Sign-up verifies the email before the account can hold keys or credits from anyone else. Users
-- of before this migration are unverified too: their next dashboard sign-in asks them to verify.
ALTER TABLE dashboard_users ADD COLUMN email_verified_at timestamptz;
-- Whose account it is, when the operator keys or credits an account by its id.
CREATE INDEX dashboard_users_account ON dashboard_users (account_id);

-- A link sent to the email: only the SHA-256 of its token is kept, with the password hash of
-- the sign-up that asked for it (confirming sets that password, so whoever chose the password
-- also holds the mailbox). Used once; gone with its user.
CREATE TABLE dashboard_email_verifications (
    token_hash bytea PRIMARY KEY,
    user_id text NOT NULL REFERENCES dashboard_users (id) ON DELETE CASCADE,
    password_hash text NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX dashboard_email_verifications_user ON dashboard_email_verifications (user_id);
CREATE INDEX dashboard_email_verifications_expiry ON dashboard_email_verifications (expires_at);

-- Failed sign-ins count per email and client address, so that a stranger's failures never
-- lock the owner out from their own address.
ALTER TABLE dashboard_sign_in_failures ADD COLUMN client text NOT NULL DEFAULT '';
ALTER TABLE dashboard_sign_in_failures DROP CONSTRAINT dashboard_sign_in_failures_pkey;
ALTER TABLE dashboard_sign_in_failures ADD PRIMARY KEY (email, client);
