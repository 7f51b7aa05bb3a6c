-- The results retention's sweep (every pod, every minute) asks for the oldest batches created
-- before the cutoff: with this index it reads them in order and stops at its limit, rather
-- than scanning every batch kept.
CREATE INDEX message_batches_created ON message_batches (created_at, id);

-- When an upload is deleted by itself (OpenAI's `expires_after`; an upload of purpose `batch`
-- expires after 30 days by default). Uploads made before this column existed were promised
-- nothing of the kind: they keep `NULL`, kept until deleted. Generated files go with their
-- batch instead.
ALTER TABLE files ADD COLUMN expires_at timestamptz;
CREATE INDEX files_expires ON files (expires_at) WHERE expires_at IS NOT NULL;
