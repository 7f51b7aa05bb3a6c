"""Plain HTTP, as `curl` would send it: the spec's wire rules without any SDK in between."""

from __future__ import annotations

import json

import httpx
import pytest

from support import RICH_CREDITS, requests_used_in_a_fresh_window, said

MODEL = "svc/haiku"
TINY = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "Hello from curl"}]}
RATE_LIMIT_HEADERS = [
    "x-ratelimit-tier",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-limit-streams",
    "x-ratelimit-remaining-streams",
]


@pytest.fixture(scope="module")
def http(api_url: str):
    with httpx.Client(base_url=api_url, timeout=30.0, trust_env=False) as client:
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_envelope(response: httpx.Response, status: int, error_type: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == error_type
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name, data) pairs of an SSE body; comment lines and blank keep-alives are skipped."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[len("event:") :].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:") :].lstrip(" "))
        if data:
            events.append((name, "\n".join(data)))
    return events


def test_a_curl_request_with_a_bearer_key_gets_a_message(http, api_key):
    response = http.post("/v1/messages", headers=bearer(api_key), json=TINY)

    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["id"].startswith("msg_")
    assert body["type"] == "message"
    assert body["model"] == MODEL
    assert body["content"][0]["type"] == "text"
    assert body["content"][0]["text"].endswith(said("Hello from curl"))
    assert set(body["usage"]) >= {
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "credits_consumed",
    }


def test_the_x_api_key_header_authenticates_too(http, api_key):
    response = http.post("/v1/messages", headers={"x-api-key": api_key}, json=TINY)

    assert response.status_code == 200, response.text


def test_every_authenticated_v1_response_carries_all_rate_limit_headers_errors_included(http, api_key):
    ok = http.post("/v1/messages", headers=bearer(api_key), json=TINY)
    bad = http.post("/v1/messages", headers=bearer(api_key), json={**TINY, "model": "svc/unknown"})
    models = http.get("/v1/models", headers=bearer(api_key))

    for response in (ok, bad, models):
        missing = [h for h in RATE_LIMIT_HEADERS if h not in response.headers]
        assert not missing, f"{response.request.method} {response.request.url} ({response.status_code}) lacks {missing}"
    assert ok.headers["x-ratelimit-limit-streams"] == "20"


def test_a_missing_or_malformed_authorization_is_401_in_the_error_envelope(http, api_key):
    assert_envelope(http.post("/v1/messages", json=TINY), 401, "authentication_error")
    assert_envelope(
        http.post("/v1/messages", headers={"Authorization": f"Basic {api_key}"}, json=TINY), 401, "authentication_error"
    )
    assert_envelope(http.post("/v1/messages", headers=bearer("nope"), json=TINY), 401, "authentication_error")


def test_unknown_paths_and_wrong_methods_answer_in_the_error_envelope(http, api_key):
    assert_envelope(http.get("/v1/nothing-here", headers=bearer(api_key)), 404, "not_found_error")
    assert_envelope(http.get("/v1/messages", headers=bearer(api_key)), 405, "invalid_request_error")


def test_a_body_that_is_not_json_is_a_bad_request(http, api_key):
    response = http.post(
        "/v1/messages",
        headers={**bearer(api_key), "content-type": "application/json"},
        content=b"{not json",
    )

    assert_envelope(response, 400, "invalid_request_error")


def test_a_body_over_16_mib_is_413_request_too_large(http, api_key):
    text = "x" * (16 * 1024 * 1024 + 1024)
    body = json.dumps({**TINY, "messages": [{"role": "user", "content": text}]}).encode()

    response = http.post("/v1/messages", headers={**bearer(api_key), "content-type": "application/json"}, content=body)

    assert_envelope(response, 413, "request_too_large")


def test_a_streamed_message_is_server_sent_events_with_named_events(http, api_key):
    response = http.post("/v1/messages", headers=bearer(api_key), json={**TINY, "stream": True})

    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    names = [name for name, _ in events]
    assert names[0] == "message_start"
    assert names[-1] == "message_stop"
    for name, data in events:
        assert json.loads(data)["type"] == name, "each event: line names the type of its data"
    order = [n for n in names if n != "ping"]
    assert order[:2] == ["message_start", "content_block_start"]
    assert order[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    (delta,) = [json.loads(data) for name, data in events if name == "message_delta"]
    assert delta["usage"]["output_tokens"] > 0
    assert delta["usage"]["credits_consumed"] > 0


def test_a_streamed_chat_completion_ends_with_done(http, api_key):
    response = http.post(
        "/v1/chat/completions",
        headers=bearer(api_key),
        json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True},
    )

    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1][1] == "[DONE]"
    for _, data in events[:-1]:
        assert json.loads(data)["id"].startswith("chatcmpl_")


def test_chat_completions_errors_use_the_same_envelope(http, api_key):
    response = http.post(
        "/v1/chat/completions",
        headers=bearer(api_key),
        json={"model": "svc/unknown", "messages": [{"role": "user", "content": "Hi"}]},
    )

    assert_envelope(response, 400, "invalid_request_error")


def test_count_tokens_returns_only_the_input_token_count(http, api_key):
    response = http.post(
        "/v1/messages/count_tokens",
        headers=bearer(api_key),
        json={"model": MODEL, "messages": TINY["messages"]},
    )

    assert response.status_code == 200, response.text
    body = response.json()
    assert list(body) == ["input_tokens"]
    assert body["input_tokens"] > 0


def test_the_account_shows_the_api_credits_pool_tier_and_limits(http, mint_key):
    minted = mint_key(tier="pay_as_you_go")

    response = http.get("/v1/account", headers=bearer(minted.key))

    assert response.status_code == 200, response.text
    account = response.json()
    assert account["object"] == "account"
    assert account["id"] == minted.account_id
    assert account["tier"] == "pay_as_you_go"
    assert account["limits"] == {"requests_per_minute": 60, "input_tokens_per_minute": 100_000, "concurrent_streams": 5}
    assert account["credits"]["pool"] == "apiCredits"
    assert account["credits"]["balance"] == RICH_CREDITS
    assert account["key"]["id"] == minted.key_id
    assert account["key"]["kind"] == "api"


def test_a_turn_debits_exactly_the_credits_it_reports_and_support_can_trace_it(http, admin, mint_key):
    minted = mint_key(tier="pay_as_you_go")

    message = http.post("/v1/messages", headers=bearer(minted.key), json=TINY).json()
    billed = message["usage"]["credits_consumed"]
    account = admin.get(f"/admin/accounts/{minted.account_id}").json()
    trace = admin.get(f"/admin/messages/{message['id']}")

    assert billed > 0
    assert account["balance"] == RICH_CREDITS - billed
    assert account["reserved"] == 0
    assert trace.status_code == 200, trace.text
    record = trace.json()
    assert record["id"] == message["id"]
    assert record["account_id"] == minted.account_id
    assert record["key_id"] == minted.key_id
    assert record["model"] == MODEL
    assert record["billed"] == billed
    assert record["reserved"] >= billed
    assert record["provider"] and record["upstream_model"]
    assert record["upstream_model"] not in json.dumps(message), "the upstream model is never shown to clients"


def test_usage_reports_the_turns_of_the_account(http, mint_key):
    minted = mint_key(tier="pay_as_you_go")
    billed = sum(
        http.post("/v1/messages", headers=bearer(minted.key), json=TINY).json()["usage"]["credits_consumed"]
        for _ in range(2)
    )

    response = http.get("/v1/usage", headers=bearer(minted.key), params={"group_by": "model"})

    assert response.status_code == 200, response.text
    usage = response.json()
    assert usage["object"] == "usage"
    assert usage["totals"]["requests"] == 2
    assert usage["totals"]["credits"] == billed
    (row,) = usage["data"]
    assert row["model"] == MODEL
    assert row["requests"] == 2


def test_a_suspended_account_is_permission_denied(http, admin, mint_key):
    minted = mint_key(tier="pay_as_you_go")
    suspended = admin.post(f"/admin/accounts/{minted.account_id}/suspend")
    assert suspended.status_code == 200, suspended.text

    assert_envelope(http.post("/v1/messages", headers=bearer(minted.key), json=TINY), 403, "permission_error")


def test_402_and_429_come_in_the_error_envelope(http, mint_key):
    poor = mint_key(tier="free", credits=0)
    assert_envelope(http.post("/v1/messages", headers=bearer(poor.key), json=TINY), 402, "insufficient_quota")

    free = mint_key(tier="free")
    count = {"model": MODEL, "messages": TINY["messages"]}
    used = requests_used_in_a_fresh_window(
        lambda: http.post("/v1/messages/count_tokens", headers=bearer(free.key), json=count)
    )
    statuses = [
        http.post("/v1/messages/count_tokens", headers=bearer(free.key), json=count).status_code
        for _ in range(5 - used)
    ]
    assert statuses == [200] * (5 - used), "count_tokens is free but counts against RPM"
    limited = http.post("/v1/messages", headers=bearer(free.key), json=TINY)
    body = assert_envelope(limited, 429, "rate_limit_error")
    assert int(limited.headers["retry-after"]) >= 1
    assert "requests per minute" in body["error"]["message"]


def test_the_admin_api_requires_the_admin_token(gateway):
    with httpx.Client(base_url=gateway.admin_url, timeout=10.0, trust_env=False) as anonymous:
        response = anonymous.post("/admin/accounts", json={"name": "intruder"})

    assert response.status_code == 401
