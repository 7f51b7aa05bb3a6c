-- The end user of a turn (issue 54): what the client named as the person it serves
-- (`metadata.user_id` on Messages, `user` or `safety_identifier` on Chat Completions and
-- Responses), kept on the turn's row for abuse investigation and per-end-user usage
-- (docs/ledger.md "End users"). At most 256 bytes: the gateway refuses a longer one.
--
-- The previous release keeps working: its statements name their columns, so it writes rows
-- without an end user (null), and it reads `message_rows` and `open_message_rows` by name;
-- the views gain the column at their end. A closed row keeps '' for none, as its batch id
-- does (no nulls in that layout); the column's default fills the closed days of before.
ALTER TABLE reservations ADD COLUMN end_user text;
ALTER TABLE messages ADD COLUMN end_user text;
ALTER TABLE closed_messages ADD COLUMN end_user text NOT NULL DEFAULT '';

CREATE OR REPLACE VIEW open_message_rows AS
SELECT m.id, m.account_id, m.key_id,
    coalesce(m.model, r.model) AS model,
    coalesce(m.served_model, r.served_model) AS served_model,
    coalesce(m.provider, u.provider) AS provider,
    coalesce(m.upstream, u.upstream) AS upstream,
    coalesce(m.upstream_model, u.upstream_model) AS upstream_model,
    coalesce(m.endpoint, r.endpoint) AS endpoint,
    m.stream, m.status, m.reserved, m.billed, m.input_tokens, m.output_tokens,
    m.cache_creation_input_tokens, m.cache_read_input_tokens, m.stop_reason, m.instance_id,
    m.created_at, m.settled_at, m.latency_ms, m.instance_epoch, m.batch_id, m.end_user
FROM messages m
LEFT JOIN message_routes r ON r.id = m.route_id
LEFT JOIN message_upstreams u ON u.id = m.upstream_id
UNION ALL
SELECT o.id, o.account_id, o.key_id, r.model, r.served_model, u.provider, u.upstream,
    u.upstream_model, r.endpoint, o.stream, 'reserved', o.reserved, 0::bigint, 0::bigint,
    0::bigint, 0::bigint, 0::bigint, NULL::text, o.instance_id, o.created_at, NULL::timestamptz,
    NULL::bigint, o.instance_epoch, o.batch_id, o.end_user
FROM reservations o
JOIN message_routes r ON r.id = o.route_id
JOIN message_upstreams u ON u.id = o.upstream_id;

CREATE OR REPLACE VIEW message_rows AS
SELECT * FROM open_message_rows
UNION ALL
SELECT message_id(c.id_prefix, c.created_at, c.id_random), a.account_id, k.key_id, r.model,
    r.served_model, u.provider, u.upstream, u.upstream_model, r.endpoint, c.stream,
    (message_statuses())[c.status], c.reserved, c.billed, c.input_tokens::bigint,
    c.output_tokens::bigint, c.cache_creation_input_tokens::bigint,
    c.cache_read_input_tokens::bigint, (message_stop_reasons())[nullif(c.stop_reason, 0)],
    i.instance_id, c.created_at, c.settled_at, nullif(c.latency_ms, -1)::bigint,
    c.instance_epoch::bigint, nullif(c.batch_id, ''), nullif(c.end_user, '')
FROM closed_messages c
JOIN message_accounts a ON a.id = c.account
JOIN message_keys k ON k.id = c.api_key
JOIN message_instances i ON i.id = c.instance
JOIN message_routes r ON r.id = c.route
JOIN message_upstreams u ON u.id = c.upstream;

-- A day is closed with its rows' end users (explicit columns: the closed partition is made
-- `LIKE closed_messages`, which copies no default).
CREATE OR REPLACE FUNCTION ledger_compact_day(day date) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    part text := 'messages_' || to_char(day, 'YYYYMMDD');
    closed text := 'closed_messages_' || to_char(day, 'YYYYMMDD');
    lo timestamptz := day::timestamp AT TIME ZONE 'UTC';
    hi timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
    fits boolean;
    open_totals text;
    closed_totals text;
BEGIN
    IF to_regclass(closed) IS NOT NULL THEN
        RETURN true;
    END IF;
    IF to_regclass(part) IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('LOCK TABLE %I IN SHARE MODE', part);
    EXECUTE format($q$
        SELECT bool_and(status <> 'reserved' AND settled_at IS NOT NULL
            AND array_position(message_statuses(), status) IS NOT NULL
            AND (stop_reason IS NULL OR array_position(message_stop_reasons(), stop_reason) IS NOT NULL)
            AND array_position(message_id_prefixes(), split_part(id, '_', 1)) IS NOT NULL
            AND message_id(array_position(message_id_prefixes(), split_part(id, '_', 1))::smallint,
                created_at, right(id, 15)) = id
            AND greatest(input_tokens, output_tokens, cache_creation_input_tokens,
                cache_read_input_tokens, latency_ms, instance_epoch) <= 2147483647
            AND coalesce(latency_ms, 0) >= 0 AND coalesce(batch_id, 'x') <> ''
            AND coalesce(end_user, 'x') <> '')
        FROM %I$q$, part) INTO fits;
    IF fits IS NOT TRUE THEN
        RETURN false;
    END IF;
    EXECUTE format('INSERT INTO message_accounts (account_id) SELECT DISTINCT account_id FROM %I
                    ON CONFLICT DO NOTHING', part);
    EXECUTE format('INSERT INTO message_keys (key_id) SELECT DISTINCT key_id FROM %I
                    ON CONFLICT DO NOTHING', part);
    EXECUTE format('INSERT INTO message_instances (instance_id) SELECT DISTINCT instance_id FROM %I
                    ON CONFLICT DO NOTHING', part);
    EXECUTE format('INSERT INTO message_routes (model, served_model, endpoint)
                    SELECT DISTINCT model, served_model, endpoint FROM %I WHERE route_id IS NULL
                    ON CONFLICT DO NOTHING', part);
    EXECUTE format('INSERT INTO message_upstreams (provider, upstream, upstream_model)
                    SELECT DISTINCT provider, upstream, upstream_model FROM %I WHERE upstream_id IS NULL
                    ON CONFLICT DO NOTHING', part);
    EXECUTE format('CREATE TABLE %I (LIKE closed_messages) WITH (autovacuum_enabled = false)', closed);
    -- The partition's bounds as a constraint, so that attaching it does not scan it.
    EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (created_at >= %L AND created_at < %L)',
        closed, closed || '_day', lo, hi);
    EXECUTE format($q$
        INSERT INTO %I (created_at, settled_at, reserved, billed, account, api_key, instance,
            route, upstream, input_tokens, output_tokens, cache_creation_input_tokens,
            cache_read_input_tokens, latency_ms, instance_epoch, status, stop_reason, id_prefix,
            stream, id_random, batch_id, end_user)
        SELECT m.created_at, m.settled_at, m.reserved, m.billed, a.id, k.id, i.id,
            coalesce(m.route_id, r.id), coalesce(m.upstream_id, u.id), m.input_tokens,
            m.output_tokens, m.cache_creation_input_tokens, m.cache_read_input_tokens,
            coalesce(m.latency_ms, -1), m.instance_epoch,
            array_position(message_statuses(), m.status),
            coalesce(array_position(message_stop_reasons(), m.stop_reason), 0),
            array_position(message_id_prefixes(), split_part(m.id, '_', 1)), m.stream,
            right(m.id, 15), coalesce(m.batch_id, ''),
            coalesce(m.end_user, '')
        FROM %I m
        JOIN message_accounts a ON a.account_id = m.account_id
        JOIN message_keys k ON k.key_id = m.key_id
        JOIN message_instances i ON i.instance_id = m.instance_id
        LEFT JOIN message_routes r ON m.route_id IS NULL
            AND (r.model, r.served_model, r.endpoint) = (m.model, m.served_model, m.endpoint)
        LEFT JOIN message_upstreams u ON m.upstream_id IS NULL
            AND (u.provider, u.upstream, u.upstream_model) = (m.provider, m.upstream, m.upstream_model)
        ORDER BY m.created_at$q$, closed, part);
    EXECUTE format('SELECT count(*) || '' '' || coalesce(sum(billed), 0) FROM %I', part)
        INTO open_totals;
    EXECUTE format('SELECT count(*) || '' '' || coalesce(sum(billed), 0) FROM %I', closed)
        INTO closed_totals;
    IF open_totals <> closed_totals THEN
        RAISE EXCEPTION 'ledger day % not closed: % rows and billed open, % closed',
            day, open_totals, closed_totals;
    END IF;
    EXECUTE format('CREATE INDEX ON %I (created_at) WITH (fillfactor = 100)', closed);
    EXECUTE format('CREATE INDEX ON %I (account, created_at) WITH (fillfactor = 100)', closed);
    EXECUTE format('ALTER TABLE closed_messages ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
        closed, lo, hi);
    EXECUTE format('TRUNCATE %I', part);
    RETURN true;
END
$$;
