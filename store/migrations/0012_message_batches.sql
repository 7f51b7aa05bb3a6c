-- Message Batches (`/v1/messages/batches`): a batch and its items, claimed by the workers of
-- every gateway pod (`FOR UPDATE SKIP LOCKED`) under a lease, so the items a killed pod held
-- go back once its lease runs out; an item's result is written once, by the worker holding it.
CREATE TABLE message_batches (
    id text PRIMARY KEY,
    account_id text NOT NULL,
    key_id text NOT NULL,
    -- The key that created it: its items run as that key, checked again when they run.
    key_hash bytea NOT NULL,
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    cancel_initiated_at timestamptz
);
CREATE INDEX message_batches_account ON message_batches (account_id, created_at, id);
CREATE INDEX message_batches_key ON message_batches (key_id);

CREATE TABLE message_batch_items (
    batch_id text NOT NULL REFERENCES message_batches (id) ON DELETE CASCADE,
    idx integer NOT NULL,
    custom_id text NOT NULL,
    params text NOT NULL,
    -- queued, running, succeeded, errored, canceled, expired
    state text NOT NULL,
    claimed_by text,
    lease_until timestamptz,
    -- `{"type":"succeeded","message":...}` and the like, once ended.
    result text,
    -- The ledger row of the turn that produced the result.
    message_id text,
    ended_at timestamptz,
    PRIMARY KEY (batch_id, idx)
);
-- The items a worker may claim, and those a sweep ends.
CREATE INDEX message_batch_items_open ON message_batch_items (batch_id, idx)
    WHERE state IN ('queued', 'running');
