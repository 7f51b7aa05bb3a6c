-- Key controls (docs/ledger.md, "Key expiry and spend caps"): a key may expire, and may carry a
-- monthly spend cap in credits. Each key counts what its turns hold and were billed this UTC
-- month on its own row, moved by the same statements that move the account's credits (the
-- account row is always locked first), so a cap holds across pods exactly as a balance does.
CREATE FUNCTION utc_month() RETURNS date LANGUAGE sql STABLE
    AS $$ SELECT date_trunc('month', now() AT TIME ZONE 'UTC')::date $$;

ALTER TABLE api_keys
    ADD COLUMN expires_at timestamptz NULL,
    ADD COLUMN spend_cap bigint NULL CHECK (spend_cap >= 0),
    -- The month `month_spent` counts; an older one counts as 0 spent.
    ADD COLUMN spend_month date NOT NULL DEFAULT utc_month(),
    ADD COLUMN month_spent bigint NOT NULL DEFAULT 0 CHECK (month_spent >= 0),
    -- Held by the key's turns reserved in Postgres (a capped key's turns always are).
    ADD COLUMN month_reserved bigint NOT NULL DEFAULT 0 CHECK (month_reserved >= 0);
