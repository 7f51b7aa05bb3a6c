-- A turn in flight is held in `reservations`, and its ledger row written once, when it ends
-- (issue 35's compact rows, docs/capacity.md "Where a row's bytes go"). A row reserved in
-- `messages`, then settled, was written twice: the settlement's new version of the row and of
-- each index entry stayed in the day's partition until autovacuum, and the index pages for
-- good (the primary key and `(account_id, created_at)` took twice their entries; the partial
-- index of reserved rows a page per few hundred turns it no longer held).
--
-- `reservations` holds only the turns in flight (turns a second times their seconds), so it is
-- small, and vacuumed as soon as a few thousand of its rows are gone. Its rows carry what the
-- settlement needs to write the turn's row; the ledger's reads see them, status `reserved`,
-- through `message_rows`.
--
-- Online: nothing moves. Rows a pod of before 0026 reserved in `messages` stay there; that pod
-- settles them (its statements are unchanged), the reaper releases them if it dies, and a pod
-- of after 0026 settles or voids one it finds there as before.
CREATE TABLE reservations (
    id text PRIMARY KEY,
    account_id text NOT NULL,
    key_id text NOT NULL,
    route_id integer NOT NULL,
    upstream_id integer NOT NULL,
    stream boolean NOT NULL,
    reserved bigint NOT NULL CHECK (reserved >= 0),
    instance_id text NOT NULL,
    instance_epoch bigint NOT NULL,
    created_at timestamptz NOT NULL,
    batch_id text
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000);

-- The ledger's rows, as they read before 0025, column for column: the rows of `messages` with
-- their names, and the turns in flight.
CREATE OR REPLACE VIEW message_rows AS
SELECT m.id, m.account_id, m.key_id,
    coalesce(m.model, r.model) AS model,
    coalesce(m.served_model, r.served_model) AS served_model,
    coalesce(m.provider, u.provider) AS provider,
    coalesce(m.upstream, u.upstream) AS upstream,
    coalesce(m.upstream_model, u.upstream_model) AS upstream_model,
    coalesce(m.endpoint, r.endpoint) AS endpoint,
    m.stream, m.status, m.reserved, m.billed, m.input_tokens, m.output_tokens,
    m.cache_creation_input_tokens, m.cache_read_input_tokens, m.stop_reason, m.instance_id,
    m.created_at, m.settled_at, m.latency_ms, m.instance_epoch, m.batch_id
FROM messages m
LEFT JOIN message_routes r ON r.id = m.route_id
LEFT JOIN message_upstreams u ON u.id = m.upstream_id
UNION ALL
SELECT o.id, o.account_id, o.key_id, r.model, r.served_model, u.provider, u.upstream,
    u.upstream_model, r.endpoint, o.stream, 'reserved', o.reserved, 0::bigint, 0::bigint,
    0::bigint, 0::bigint, 0::bigint, NULL::text, o.instance_id, o.created_at, NULL::timestamptz,
    NULL::bigint, o.instance_epoch, o.batch_id
FROM reservations o
JOIN message_routes r ON r.id = o.route_id
JOIN message_upstreams u ON u.id = o.upstream_id;
