-- What the ApiKey resources grant each key, as last audited (docs/operator.md, "Audited
-- grants"): the operator compares each published config's grants with these rows and writes an
-- audit row for each one that changed, in the same transaction as its row here, so a change is
-- audited once whichever replica leads and however often the config is published again.
-- The grant never holds a secret (a seed's is left out).
CREATE TABLE key_grants (
    key_id text PRIMARY KEY REFERENCES api_keys (id),
    granted jsonb NOT NULL,
    recorded_at timestamptz NOT NULL
);
