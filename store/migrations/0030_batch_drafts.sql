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

-- An OpenAI batch's item (`/v1/batches`) refers to its line of the input file instead of
-- holding a copy of its body (`params` is then ''): the line is read from `files` when the
-- item runs, so one file feeds any number of batches and counts once in its account's quota.
-- A file with open items referring to it cannot be deleted. Rows of the previous release
-- keep NULL here and their params; during a rolling upgrade a pod of the previous release that
-- claims a new row finds empty params and ends that item errored (400), billed nothing.
ALTER TABLE message_batch_items
    ADD COLUMN line_file_id text,
    ADD COLUMN line_offset bigint,
    ADD COLUMN line_len bigint;
