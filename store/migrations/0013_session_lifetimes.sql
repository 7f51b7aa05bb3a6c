-- Idle lifetimes of dashboard sessions: when a request last used each one (written at most
-- about once a minute per session, not on every page view). `expires_at` stays the absolute end.
ALTER TABLE dashboard_sessions ADD COLUMN last_used_at timestamptz NOT NULL DEFAULT now();
