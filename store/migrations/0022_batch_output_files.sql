-- A batch's output and error files (`/v1/files`, purpose `batch_output`): a row each once its
-- batch has ended, holding their size (their content is read from the batch's items, never
-- stored here), listed and deleted as uploads are and counted in no upload quota. A deleted
-- one keeps its row, marked, so that it is not recorded again.
ALTER TABLE files
    ADD COLUMN batch_id text,
    ADD COLUMN deleted_at timestamptz;
