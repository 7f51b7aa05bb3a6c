-- Usage rollups: per account, hour, key and model, what the ledger's final rows add up to.
-- Written by the same statement that makes a row's bill final (settle, write, void, the
-- reaper's release), so they are never behind the books; /v1/usage and the dashboard's
-- charts read them instead of the rows. A row counts in the hour of its `created_at` (when
-- the turn started), whenever it settles. `turns` and the token and credit sums are of the
-- served turns (every final status but `failed` and `abandoned`); `errors` counts those two.
CREATE TABLE usage_rollups (
    account_id text NOT NULL,
    hour timestamptz NOT NULL,
    key_id text NOT NULL,
    model text NOT NULL,
    turns bigint NOT NULL,
    errors bigint NOT NULL,
    input_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL,
    cache_creation_input_tokens bigint NOT NULL,
    cache_read_input_tokens bigint NOT NULL,
    credits bigint NOT NULL,
    batch_turns bigint NOT NULL,
    batch_credits bigint NOT NULL,
    PRIMARY KEY (account_id, hour, key_id, model)
);

INSERT INTO usage_rollups
SELECT account_id, date_trunc('hour', created_at, 'UTC'), key_id, model,
    count(*) FILTER (WHERE status NOT IN ('failed', 'abandoned')),
    count(*) FILTER (WHERE status IN ('failed', 'abandoned')),
    coalesce(sum(input_tokens) FILTER (WHERE status NOT IN ('failed', 'abandoned')), 0),
    coalesce(sum(output_tokens) FILTER (WHERE status NOT IN ('failed', 'abandoned')), 0),
    coalesce(sum(cache_creation_input_tokens) FILTER (WHERE status NOT IN ('failed', 'abandoned')), 0),
    coalesce(sum(cache_read_input_tokens) FILTER (WHERE status NOT IN ('failed', 'abandoned')), 0),
    sum(billed),
    count(*) FILTER (WHERE batch_id IS NOT NULL AND status NOT IN ('failed', 'abandoned')),
    coalesce(sum(billed) FILTER (WHERE batch_id IS NOT NULL), 0)
FROM messages WHERE status <> 'reserved'
GROUP BY 1, 2, 3, 4;
