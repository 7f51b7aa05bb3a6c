-- The audit log (docs/dashboard.md, "Audit log"): one row per change to money or access, written
-- in the same transaction as the change. Append-only: the trigger below refuses UPDATE and
-- DELETE (and TRUNCATE) whoever asks, so not even the gateway's own role can edit history.
CREATE TABLE audit_log (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now(),
    -- dashboard_user, admin_token, operator, stripe_webhook, cli, sweep
    actor_kind text NOT NULL,
    -- A user's email, an event or process name: never a secret.
    actor_id text NOT NULL,
    account_id text NOT NULL,
    -- A closed set, named by `store::audit::Action`.
    action text NOT NULL,
    -- What was changed: a key id, a payment reference, a dispute id.
    target text NOT NULL,
    before jsonb NULL CHECK (octet_length(before::text) <= 4096),
    after jsonb NULL CHECK (octet_length(after::text) <= 4096),
    client text NULL
);
CREATE INDEX audit_log_account ON audit_log (account_id, id DESC);

CREATE FUNCTION audit_log_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER audit_log_append_only
    BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_refuse_change();
CREATE TRIGGER audit_log_no_truncate
    BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_refuse_change();
