-- Responses the Responses API stored (`store: true`), kept for the retention period
-- (`--responses-retention-secs`) and purged by every pod's periodic sweep. The account is not
-- a foreign key: a stored response moves no money, and the purge is its only deletion path
-- besides the client's DELETE.
CREATE TABLE stored_responses (
    id text PRIMARY KEY,
    account_id text NOT NULL,
    created_at timestamptz NOT NULL,
    response jsonb NOT NULL,
    input_items jsonb NOT NULL
);
-- The purge deletes by age, oldest first.
CREATE INDEX stored_responses_created_at ON stored_responses (created_at);
