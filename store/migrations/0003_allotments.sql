-- Credits a gateway process holds for an account's next turns (docs/ledger.md, "Allotments").
-- They are part of accounts.reserved, so no other process can spend them; the process returns
-- an allotment when it goes idle or stops, and the reaper returns a dead process' allotments.
CREATE TABLE allotments (
    id text PRIMARY KEY,
    instance_id text NOT NULL,
    account_id text NOT NULL REFERENCES accounts (id),
    credits bigint NOT NULL CHECK (credits >= 0)
);
CREATE INDEX allotments_instance ON allotments (instance_id);
