# Sourced by the benchmarks that run `gateway serve` (scripts/bench-upstream,
# scripts/bench-instructions): a throwaway redis-server and Postgres (fsync on, as in
# production) under $WORK, the folder the caller removes at exit. Needs redis-server and
# Postgres' server binaries (Debian: apt-get install redis-server postgresql; scripts/test
# installs both). Sets REDIS_PORT; PG_BIN, PG_DATA, PG_PORT, PG_PID and DATABASE_URL.

bench_free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start_redis: a redis-server on a free port; its pid in REDIS_PID.
start_redis() {
    command -v redis-server >/dev/null 2>&1 ||
        { echo "$0: redis-server not found (apt-get install redis-server)" >&2; exit 1; }
    REDIS_PORT=$(bench_free_port)
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" \
        --daemonize no --logfile "$WORK/redis.log" &
    REDIS_PID=$!
    for _ in $(seq 100); do
        [[ "$(redis-cli -p "$REDIS_PORT" ping 2>/dev/null)" == PONG ]] && return 0
        sleep 0.1
    done
    echo "$0: redis-server did not answer" >&2
    exit 1
}

# start_postgres: a Postgres cluster on a free port, migrated by the gateway binary $1.
start_postgres() {
    # The server's own folder (pg_isready sits next to initdb there, not always on PATH).
    local initdb run_as=()
    initdb=$(command -v initdb 2>/dev/null || ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort | tail -n 1)
    PG_BIN=$(dirname "$(readlink -f "$initdb")")
    [[ -x "$PG_BIN/initdb" ]] || { echo "$0: initdb not found (apt-get install postgresql)" >&2; exit 1; }
    PG_DATA=$WORK/pg/data
    mkdir -p "$WORK/pg"
    # Postgres refuses to run as root: the cluster belongs to the postgres user then.
    if [[ $(id -u) = 0 ]]; then
        local user
        user=$(id -u postgres >/dev/null 2>&1 && echo postgres || echo nobody)
        chmod o+x "$WORK" # mktemp's 0700 would keep that user out of its own folder
        chown "$user" "$WORK/pg"
        run_as=(runuser -u "$user" --)
    fi
    "${run_as[@]}" "$PG_BIN/initdb" -N -U postgres --auth=trust -E UTF8 -D "$PG_DATA" >/dev/null
    PG_PORT=$(bench_free_port)
    "${run_as[@]}" "$PG_BIN/postgres" -D "$PG_DATA" -p "$PG_PORT" -c listen_addresses=127.0.0.1 \
        -c unix_socket_directories="$WORK/pg" -c max_connections=100 >"$WORK/postgres.log" 2>&1 &
    PG_PID=$!
    for _ in $(seq 100); do
        "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" && break
        kill -0 "$PG_PID" 2>/dev/null || { cat "$WORK/postgres.log" >&2; exit 1; }
        sleep 0.1
    done
    "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" ||
        { echo "$0: postgres did not answer" >&2; cat "$WORK/postgres.log" >&2; exit 1; }
    DATABASE_URL=postgres://postgres@127.0.0.1:$PG_PORT/postgres
    "$1" migrate --database-url "$DATABASE_URL" >&2
}

# stop_postgres: a fast shutdown of the postmaster itself (runuser, when root, does not pass
# SIGINT on).
stop_postgres() {
    local postmaster
    postmaster=$(head -n 1 "${PG_DATA:-/nonexistent}/postmaster.pid" 2>/dev/null || true)
    if [[ -n "$postmaster" ]]; then kill -INT "$postmaster" 2>/dev/null || true; fi
    if [[ -n "${PG_PID:-}" ]]; then wait "$PG_PID" 2>/dev/null || true; fi
}

# bench_key_manifest DIR KEY_ID: an ApiKey granting KEY_ID limits no load test reaches.
bench_key_manifest() {
    cat > "$1/bench-key.yaml" <<YAML
apiVersion: gateway.svc.dev/v1alpha1
kind: ApiKey
metadata:
  name: bench-key
spec:
  keyId: $2
  tier: enterprise
  limits:
    requestsPerMinute: 1000000000
    inputTokensPerMinute: 1000000000000
    concurrentStreams: 100000
YAML
}
