-- Stripe: the payment behind each top-up (so that its refunds and disputes find it), how much
-- of it was refunded so far, the refunds and disputes taken back, and the credits an account
-- owes when its balance could not cover a reversal (taken from its next top-ups).

ALTER TABLE top_ups
    ADD COLUMN payment_id text NULL UNIQUE,
    -- Stripe reports a charge's refunded total, not each refund: the highest total seen.
    ADD COLUMN refunded_cents bigint NOT NULL DEFAULT 0 CHECK (refunded_cents >= 0);

ALTER TABLE accounts
    ADD COLUMN owed_credits bigint NOT NULL DEFAULT 0 CHECK (owed_credits >= 0);

-- One row per money movement back: a refund (by the charge's refunded total), a dispute opened
-- (taken back) and a dispute won (given back). `id` makes each one happen once.
CREATE TABLE payment_reversals (
    id text PRIMARY KEY,
    account_id text NOT NULL REFERENCES accounts (id),
    reference text NOT NULL REFERENCES top_ups (reference),
    kind text NOT NULL CHECK (kind IN ('refund', 'dispute', 'dispute_won')),
    usd_cents bigint NOT NULL CHECK (usd_cents >= 0),
    -- Credits moved off (refund, dispute) or back onto (dispute_won) the balance.
    credits bigint NOT NULL CHECK (credits >= 0),
    -- Credits that could not be taken (recorded as owed) or that cleared what was owed.
    owed bigint NOT NULL CHECK (owed >= 0),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payment_reversals_account ON payment_reversals (account_id, created_at DESC);

-- A dispute's state, so that its opening and its closing each move money once, in any order.
CREATE TABLE payment_disputes (
    id text PRIMARY KEY,
    reference text NOT NULL REFERENCES top_ups (reference),
    status text NOT NULL CHECK (status IN ('open', 'won', 'lost'))
);

-- Auto-reload: "when the balance falls below `threshold_credits`, add `usd_cents`", charged
-- off-session to the card saved at the account's first Stripe checkout. `armed` goes false
-- when a pod starts a reload (one UPDATE, so one pod per crossing) and true again once the
-- balance is back at the threshold or the attempt failed; `attempt` numbers the charges and
-- is their idempotency key, so a retried call after a network error charges once.
CREATE TABLE auto_reloads (
    account_id text PRIMARY KEY REFERENCES accounts (id),
    customer_id text NULL,
    payment_method_id text NULL,
    enabled boolean NOT NULL DEFAULT false,
    threshold_credits bigint NOT NULL DEFAULT 0 CHECK (threshold_credits >= 0),
    usd_cents bigint NOT NULL DEFAULT 0 CHECK (usd_cents >= 0),
    armed boolean NOT NULL DEFAULT true,
    attempt bigint NOT NULL DEFAULT 0,
    declines integer NOT NULL DEFAULT 0,
    last_failure text NULL
);
