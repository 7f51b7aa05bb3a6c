-- Files (`/v1/files`): an account's uploads, such as the JSONL input of an OpenAI batch.
CREATE TABLE files (
    id text PRIMARY KEY,
    account_id text NOT NULL,
    filename text NOT NULL,
    purpose text NOT NULL,
    bytes bigint NOT NULL,
    content bytea NOT NULL,
    created_at timestamptz NOT NULL
);
CREATE INDEX files_account ON files (account_id, created_at, id);
