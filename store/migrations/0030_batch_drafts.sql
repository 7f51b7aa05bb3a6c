-- A Message Batch create's items as its body is read (`store::batches::BatchDraft`): kept here,
-- seen by no read, claim or quota, until the create moves them into message_batch_items in
-- one transaction with its batch row. A create refused or cut midway deletes its rows; those
-- of a pod that died midway are deleted by the batch sweep a day after they were written
-- (longer than any body may take to arrive).
CREATE TABLE message_batch_drafts (
    draft_id text NOT NULL,
    idx integer NOT NULL,
    custom_id text NOT NULL,
    params text NOT NULL,
    -- The `errored` result of a request refused at the create; its params are then ''.
    result text,
    staged_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (draft_id, idx)
);
CREATE INDEX message_batch_drafts_staged ON message_batch_drafts (staged_at);
