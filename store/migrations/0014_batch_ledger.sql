-- The Message Batch a turn ran for: a batch item's ledger row names its batch.
ALTER TABLE messages ADD COLUMN batch_id text;
