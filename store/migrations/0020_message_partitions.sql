-- The message ledger by day (docs/capacity.md, "Partitions and retention"): `messages` is
-- range-partitioned on `created_at`, one partition per UTC day (`messages_YYYYMMDD`), so a
-- day is archived and dropped whole, never deleted row by row, and autovacuum leaves closed
-- days alone. A message id carries its `created_at` (store::ledger::message_id), so a lookup
-- by id stays one probe of one partition's primary key `(id, created_at)`.
--
-- The gateway creates the days ahead (today and the next 7, at start and hourly) with
-- `ledger_day_partition`. A DEFAULT partition catches a row of a day that has none (the job
-- stopped for a week, a clock far off, a row written for a day already dropped): the turn is
-- billed rather than refused. It stays empty otherwise; creating a day whose rows sit in it
-- moves them into the new partition first (Postgres refuses to attach a range the default
-- holds rows of).
ALTER TABLE messages RENAME TO messages_unpartitioned;
ALTER INDEX messages_pkey RENAME TO messages_unpartitioned_pkey;
ALTER INDEX messages_account_created RENAME TO messages_unpartitioned_account_created;
ALTER INDEX messages_open RENAME TO messages_unpartitioned_open;

CREATE TABLE messages (
    id text NOT NULL,
    account_id text NOT NULL REFERENCES accounts (id),
    key_id text NOT NULL,
    model text NOT NULL,
    served_model text NOT NULL,
    provider text NOT NULL,
    upstream text NOT NULL,
    upstream_model text NOT NULL,
    endpoint text NOT NULL,
    stream boolean NOT NULL,
    status text NOT NULL,
    reserved bigint NOT NULL CHECK (reserved >= 0),
    billed bigint NOT NULL DEFAULT 0 CHECK (billed >= 0 AND billed <= reserved),
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cache_creation_input_tokens bigint NOT NULL DEFAULT 0,
    cache_read_input_tokens bigint NOT NULL DEFAULT 0,
    stop_reason text NULL,
    instance_id text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    settled_at timestamptz NULL,
    latency_ms bigint NULL,
    instance_epoch bigint NOT NULL DEFAULT 0,
    batch_id text,
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE INDEX messages_account_created ON messages (account_id, created_at);
CREATE INDEX messages_open ON messages (instance_id) WHERE status = 'reserved';
CREATE TABLE messages_default PARTITION OF messages DEFAULT;

-- Creates the partition of one UTC day unless it exists; true when it did. Safe from several
-- pods at once (the advisory lock), and cheap on the parent: the table is made alone, then
-- attached (SHARE UPDATE EXCLUSIVE on `messages`, which turns and reads do not wait for).
CREATE FUNCTION ledger_day_partition(day date) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    part text := 'messages_' || to_char(day, 'YYYYMMDD');
    lo timestamptz := day::timestamp AT TIME ZONE 'UTC';
    hi timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('ledger_day_partition'));
    IF to_regclass(part) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE messages INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', part);
    -- The partition's bounds as a constraint, so that attaching it does not scan it.
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (created_at >= %L AND created_at < %L)',
        part, part || '_day', lo, hi);
    EXECUTE format('WITH moved AS (DELETE FROM messages_default WHERE created_at >= %L AND created_at < %L RETURNING *)
                    INSERT INTO %I SELECT * FROM moved', lo, hi, part);
    EXECUTE format('ALTER TABLE messages ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', part, lo, hi);
    RETURN true;
END
$$;

-- A partition for every day the ledger has rows of, and for today and the next 7; then the
-- rows, each into its day.
SELECT ledger_day_partition(day)
FROM (
    SELECT DISTINCT (created_at AT TIME ZONE 'UTC')::date AS day FROM messages_unpartitioned
    UNION
    SELECT (now() AT TIME ZONE 'UTC')::date + ahead FROM generate_series(0, 7) ahead
) days
ORDER BY day;

INSERT INTO messages (id, account_id, key_id, model, served_model, provider, upstream,
    upstream_model, endpoint, stream, status, reserved, billed, input_tokens, output_tokens,
    cache_creation_input_tokens, cache_read_input_tokens, stop_reason, instance_id, created_at,
    settled_at, latency_ms, instance_epoch, batch_id)
SELECT id, account_id, key_id, model, served_model, provider, upstream,
    upstream_model, endpoint, stream, status, reserved, billed, input_tokens, output_tokens,
    cache_creation_input_tokens, cache_read_input_tokens, stop_reason, instance_id, created_at,
    settled_at, latency_ms, instance_epoch, batch_id
FROM messages_unpartitioned;

DROP TABLE messages_unpartitioned;
