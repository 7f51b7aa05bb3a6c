-- The results retention's sweep (every pod, every minute) asks for the oldest batches created
-- before the cutoff: with this index it reads them in order and stops at its limit, rather
-- than scanning every batch kept.
CREATE INDEX message_batches_created ON message_batches (created_at, id);
