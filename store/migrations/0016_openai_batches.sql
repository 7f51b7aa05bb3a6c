-- OpenAI batches (`/v1/batches`) are Message Batches too: `format` says whose requests its
-- items are (the worker runs them as that API's turn, each API lists its own), `details` what
-- the OpenAI API echoes back of the create (input file, endpoint, metadata, errors).
ALTER TABLE message_batches
    ADD COLUMN format text NOT NULL DEFAULT 'messages',
    ADD COLUMN details text;
