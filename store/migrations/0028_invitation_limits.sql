-- Invitations are limited per organization and per address within an hour, counted from the
-- audit log's `invitation_sent` rows (a withdrawn invitation stays counted: withdrawing and
-- inviting again sent another mail). These partial indexes answer both counts from the
-- recent rows alone.
CREATE INDEX audit_log_invitations_by_account ON audit_log (account_id, at)
    WHERE action = 'invitation_sent';
CREATE INDEX audit_log_invitations_by_address ON audit_log (target, at)
    WHERE action = 'invitation_sent';
