"""Fixtures shared by the SDK conformance tests.

One gateway process serves the whole session:

    gateway standalone --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
        --admin-token ADMIN_TOKEN --dev-key DEV_KEY --simulated-chunk-delay-ms 2

The binary is `$GATEWAY_BIN`, else `<repo>/target/debug/gateway`; it runs from the repository
root so that its default `--manifests deploy/standalone` resolves, and its stderr goes to
`target/pytest-gateway.stderr.log`. The fixture waits (at most
30 s) for the `ready api=... admin=...` line on stdout and terminates the process at the end.

`run_gateway` starts further gateways with flags of their own (the upstream adapter tests route
every model to a mock upstream with `--manifests`).

Tests that need limits of their own (a free key, an account without credits, a CLI key) mint
fresh accounts and keys through the admin API with `mint_key`, so no test shares a rate-limit
window or a balance with another one.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import itertools
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from mock_upstream import MockUpstream, routed_manifests
from support import RICH_CREDITS, tiny_png

REPO_ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "pytest-admin-token-0123456789"
DEV_KEY = "sk-svc-pytest-0123456789abcdef0123456789"
READY_TIMEOUT_S = 30.0
STDERR_LOG = REPO_ROOT / "target" / "pytest-gateway.stderr.log"
READY_RE = re.compile(r"^ready api=(?P<api>\S+) admin=(?P<admin>\S+)")

# The SDK clients must talk to the loopback gateway directly, never through a proxy.
os.environ["NO_PROXY"] = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1", "localhost"]))
os.environ["no_proxy"] = os.environ["NO_PROXY"]


@dataclasses.dataclass(frozen=True)
class Gateway:
    api_url: str
    admin_url: str
    admin_token: str
    dev_key: str
    pid: int


@dataclasses.dataclass(frozen=True)
class MintedKey:
    key: str
    key_id: str
    account_id: str
    tier: str
    kind: str


def _gateway_binary() -> Path:
    explicit = os.environ.get("GATEWAY_BIN")
    path = Path(explicit) if explicit else REPO_ROOT / "target" / "debug" / "gateway"
    if not path.is_file():
        pytest.exit(f"gateway binary not found at {path}; run `cargo build -p gateway` or set GATEWAY_BIN", 2)
    return path


def _pump_lines(stream, lines: queue.Queue[str | None]) -> None:
    """Reads the child's stdout until EOF so that it never blocks on a full pipe."""
    for raw in iter(stream.readline, b""):
        lines.put(raw.decode("utf-8", "replace").rstrip("\n"))
    lines.put(None)


@contextlib.contextmanager
def run_gateway(extra_args: list[str], stderr_path: Path = STDERR_LOG) -> Iterator[Gateway]:
    """Starts `gateway standalone` with the test admin token and dev key plus `extra_args`,
    waits for its ready line, and stops it (SIGTERM, expecting exit 0) at the end."""
    binary = _gateway_binary()
    args = [
        str(binary),
        "standalone",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--admin-token",
        ADMIN_TOKEN,
        "--dev-key",
        DEV_KEY,
        *extra_args,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    stderr_path.parent.mkdir(parents=True, exist_ok=True)
    with open(stderr_path, "wb") as stderr_log:
        proc = subprocess.Popen(
            args, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr_log
        )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump_lines, args=(proc.stdout, lines), daemon=True).start()

    def stderr_tail() -> str:
        return stderr_path.read_text(errors="replace")[-4000:]

    deadline = time.monotonic() + READY_TIMEOUT_S
    ready = None
    seen: list[str] = []
    while ready is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            proc.kill()
            pytest.exit(f"gateway printed no ready line within {READY_TIMEOUT_S}s; stdout={seen!r}\n{stderr_tail()}", 2)
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            continue
        if line is None:
            proc.wait(timeout=5)
            pytest.exit(f"gateway exited ({proc.returncode}) before ready; stdout={seen!r}\n{stderr_tail()}", 2)
        seen.append(line)
        ready = READY_RE.match(line)

    try:
        yield Gateway(
            api_url=ready["api"].rstrip("/"),
            admin_url=ready["admin"].rstrip("/"),
            admin_token=ADMIN_TOKEN,
            dev_key=DEV_KEY,
            pid=proc.pid,
        )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
    # The contract: on SIGTERM the gateway drains and exits 0.
    assert proc.returncode == 0, f"gateway exited with {proc.returncode} after SIGTERM\n{stderr_tail()}"


@pytest.fixture(scope="session")
def gateway() -> Iterator[Gateway]:
    with run_gateway(["--simulated-chunk-delay-ms", "2"]) as gw:
        yield gw


@pytest.fixture(scope="session")
def api_url(gateway: Gateway) -> str:
    return gateway.api_url


@pytest.fixture(scope="session")
def admin(gateway: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=gateway.admin_url,
        headers={"Authorization": f"Bearer {gateway.admin_token}"},
        timeout=10.0,
        trust_env=False,
    ) as client:
        yield client


_names = itertools.count(1)

# The confirmed lifetime top-up (US cents) that gives a new key its tier (deploy/standalone).
TOP_UP_CENTS_FOR_TIER = {"pay_as_you_go": 1_000, "high_volume": 50_000}
# The gateway's default --credits-per-usd.
CREDITS_PER_USD = 100_000


@pytest.fixture(scope="session")
def mint_key(admin: httpx.Client) -> Callable[..., MintedKey]:
    """Mints a fresh account (with `credits`) and one key on it through the admin API."""

    def mint(*, tier: str = "high_volume", credits: int = RICH_CREDITS, kind: str = "api") -> MintedKey:
        n = next(_names)
        cents = TOP_UP_CENTS_FOR_TIER.get(tier, 0)
        # The account holds `credits` (or, when that is less, what the tier's top-up brings):
        # the top-up brings its share of them.
        grant = max(credits - cents * CREDITS_PER_USD // 100, 0)
        account = admin.post("/admin/accounts", json={"name": f"pytest-{n}", "credits": grant})
        assert account.status_code == 201, account.text
        account_id = account.json()["id"]
        body = {"account_id": account_id, "name": f"pytest-key-{n}", "kind": kind}
        if tier == "enterprise":
            body["tier"] = tier
        elif cents:
            # Tiers follow confirmed top-ups only: the account pays what the tier takes first.
            paid = admin.post(f"/admin/accounts/{account_id}/topups", json={"usd_cents": cents, "reference": f"pytest-tier-{n}"})
            assert paid.status_code == 200, paid.text
        key = admin.post("/admin/keys", json=body)
        assert key.status_code == 201, key.text
        body = key.json()
        assert body["tier"] == tier and body["kind"] == kind, body
        return MintedKey(key=body["key"], key_id=body["id"], account_id=account_id, tier=tier, kind=kind)

    return mint


@pytest.fixture(scope="module")
def api_key(mint_key: Callable[..., MintedKey]) -> str:
    """A high_volume key (300 RPM) on a rich account, fresh for each test module."""
    return mint_key(tier="high_volume").key


@pytest.fixture(scope="module")
def free_key(mint_key: Callable[..., MintedKey]) -> str:
    """A free-tier key: 5 requests per minute."""
    return mint_key(tier="free").key


@pytest.fixture(scope="module")
def poor_key(mint_key: Callable[..., MintedKey]) -> str:
    """A free key on an account with no apiCredits at all (a paid tier's top-up would fund it)."""
    return mint_key(tier="free", credits=0).key


@pytest.fixture(scope="module")
def cli_key(mint_key: Callable[..., MintedKey]) -> str:
    """A CLI key: valid, but not allowed on /v1/*."""
    return mint_key(kind="cli").key


@pytest.fixture(scope="session")
def png_base64() -> str:
    return base64.b64encode(tiny_png()).decode("ascii")


@pytest.fixture(scope="module", params=["anthropic", "openai", "azure-openai", "bedrock", "gemini", "vertex"])
def routed(request, tmp_path_factory) -> Iterator[tuple[str, str, MockUpstream]]:
    """(adapter, gateway URL, mock) for a gateway routing every model through `adapter` to a
    scripted mock upstream (`mock_upstream.py`); one per test module."""
    mock = MockUpstream()
    folder = routed_manifests(REPO_ROOT, tmp_path_factory.mktemp("manifests"), request.param, mock)
    log = REPO_ROOT / "target" / f"pytest-gateway-{request.module.__name__}-{request.param}.stderr.log"
    try:
        with run_gateway(["--manifests", str(folder)], log) as gw:
            yield request.param, gw.api_url, mock
    finally:
        mock.close()
