-- A turn admitted with more max_tokens than its model's context window had room for is capped
-- to that room, and one that fills it stops with `model_context_window_exceeded`
-- (store::usage::StopReason). A closed row keeps its stop reason as an index into this list,
-- so the name is added at its end (earlier names keep their numbers: the rows closed before,
-- and the previous release, which never writes the new name, read as they did); without it a
-- day holding such a row would never be compacted.
CREATE OR REPLACE FUNCTION message_stop_reasons() RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY['end_turn', 'max_tokens', 'stop_sequence', 'tool_use',
        'model_context_window_exceeded']
$$;
