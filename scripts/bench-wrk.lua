-- wrk cross-check of the JSON benchmark: the same tiny POST /v1/messages as `loadgen --mode json`.
-- usage: BENCH_KEY=... wrk -t2 -c128 -d10s -s scripts/bench-wrk.lua http://127.0.0.1:PORT/v1/messages
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("BENCH_KEY") or "missing-BENCH_KEY")
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"svc/haiku","max_tokens":16,"messages":[{"role":"user","content":"ping"}]}'

done = function(summary, latency, requests)
  io.write(string.format("wrk: %d requests in %.1f s = %.0f req/s; latency p50=%.2f ms p90=%.2f ms p99=%.2f ms max=%.2f ms\n",
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000, latency.max / 1000))
  io.write(string.format("wrk: non-2xx/3xx=%d socket errors connect=%d read=%d write=%d timeout=%d\n",
    summary.errors.status, summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout))
end
