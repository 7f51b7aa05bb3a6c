"""deploy/local/run: one command brings up Redis, Postgres (migrated), two `gateway serve` pods
and a round-robin balancer; requests through the balancer reach both pods and share one key's limits; Ctrl-C
stops every process of the stack and removes its state."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN = REPO_ROOT / "deploy" / "local" / "run"
DEV_KEY = "sk-svc-localtest000000000000000000000000000000"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_until_ready(proc: subprocess.Popen[str], within_s: float) -> str:
    out = []
    deadline = time.monotonic() + within_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        out.append(line)
        if line.startswith("Ctrl-C stops everything"):
            return "".join(out)
    raise AssertionError("the stack did not come up:\n" + "".join(out))


def test_two_pods_behind_the_balancer_share_limits_and_ctrl_c_stops_all() -> None:
    port = free_port()
    env = {
        **os.environ,
        "PORT": str(port),
        "DEV_KEY": DEV_KEY,
        "GATEWAY_BIN": os.environ.get("GATEWAY_BIN", str(REPO_ROOT / "target/debug/gateway")),
        "OPERATOR_BIN": os.environ.get("OPERATOR_BIN", str(REPO_ROOT / "target/debug/operator")),
    }
    proc = subprocess.Popen(
        [str(RUN)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        banner = read_until_ready(proc, 60)
        admins = re.search(r"admin\s+(http\S+) (http\S+)", banner)
        assert admins, banner
        state = re.search(r"logs\s+(\S+)", banner)
        assert state, banner
        body = {"model": "svc/haiku", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}
        base = f"http://127.0.0.1:{port}"
        reset = int(
            httpx.get(f"{base}/v1/models", headers={"x-api-key": DEV_KEY}).headers["x-ratelimit-reset-requests"]
        )
        if reset < 5:  # all four requests in one rate-limit window
            time.sleep(reset + 1)
        remaining = []
        for _ in range(4):
            # A connection each: the balancer spreads connections, not requests.
            r = httpx.post(f"{base}/v1/messages", json=body, headers={"x-api-key": DEV_KEY}, timeout=30)
            assert r.status_code == 200, r.text
            assert r.headers["request-id"] == r.json()["id"]
            remaining.append(int(r.headers["x-ratelimit-remaining-requests"]))
        # One window shared through Redis: the count goes down across both pods.
        assert remaining == sorted(remaining, reverse=True) and len(set(remaining)) == 4, remaining
        for admin in admins.groups():
            ready = httpx.get(f"{admin}/readyz", timeout=10)
            assert ready.status_code == 200 and ready.json()["ledger_store"] == "ok", ready.text
            # Two turns per pod, served from the pod's allotment for the account: each turn's
            # ledger row is written (alone or batched) just after its answer.
            written = 'gateway_ledger_batch_turns_sum{op="write"} 2.0'
            for _ in range(50):
                metrics = httpx.get(f"{admin}/metrics", timeout=10).text
                if written in metrics:
                    break
                time.sleep(0.1)
            assert written in metrics, metrics
            assert 'gateway_requests_total{endpoint="/v1/messages",model="svc/haiku",status="200"} 2' in metrics
            # Credits are held in Postgres: its calls are timed.
            assert 'gateway_store_call_duration_seconds_count{store="postgres",op="query"}' in metrics
    finally:
        os.killpg(proc.pid, signal.SIGINT) if proc.poll() is None else None
        rest, _ = proc.communicate(timeout=30)
    assert "local stack stopped" in rest, rest
    # With the ledger's --database-url the stack runs Postgres and the migrations too.
    assert "==> postgres on 127.0.0.1:" in banner, banner
    assert not Path(state.group(1)).exists()
