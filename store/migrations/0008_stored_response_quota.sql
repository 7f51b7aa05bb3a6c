-- Each account's stored responses are kept within a quota of bytes (`--responses-account-max-bytes`):
-- a row's `bytes` is what it counts (its JSON text, ids and a fixed overhead, computed by the
-- gateway), and a put sums the account's rows through this index, oldest evicted first.
ALTER TABLE stored_responses ADD COLUMN bytes bigint NOT NULL DEFAULT 0;
UPDATE stored_responses
SET bytes = octet_length(response::text) + octet_length(input_items::text)
    + octet_length(id) + octet_length(account_id);
CREATE INDEX stored_responses_account ON stored_responses (account_id, created_at) INCLUDE (bytes);
