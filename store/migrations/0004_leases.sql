-- Leases (docs/ledger.md, "Leases and fencing"): a process' row in gateway_instances is its
-- lease, and `epoch` its fencing token. The reaper deletes the row of a process it takes for
-- dead; the process then registers again under the next epoch, and every allotment or
-- reservation stamped with an older epoch is refused to it (Postgres checks the pair on every
-- grant and every write). A draining process announces how long it may still write, and is
-- not taken for dead before then. Epoch 0 is a process of before leases (its rows carry 0
-- too), so that one keeps its reservations through a rolling deploy; processes with leases
-- register under 1 and up.
ALTER TABLE gateway_instances
    ADD COLUMN epoch bigint NOT NULL DEFAULT 0,
    ADD COLUMN draining_until timestamptz NULL;

ALTER TABLE allotments ADD COLUMN epoch bigint NOT NULL DEFAULT 0;

ALTER TABLE messages ADD COLUMN instance_epoch bigint NOT NULL DEFAULT 0;
