"""Both Vertex AI mocks, the e2e tests' (`tests/src/vertex.rs`, run as the `mock-upstream` binary
next to the gateway binary) and the Python SDK tests' (`mock_upstream.py`, which the `routed` tests'
vertex route calls), speak Claude on Vertex as Anthropic's own Vertex client reads it:
`anthropic.AnthropicVertex` with an access token gets a message (`:rawPredict`) and a stream
(`:streamRawPredict`) from each, and is refused with Google's 401 for a token the mock never
granted. The tokens come from the mocks' metadata server (GKE Workload Identity's endpoint), whose
`Metadata-Flavor: Google` header is required; the Python mock's token endpoint is checked as
Google's: it grants a token for a service account's JWT signed with the account's key, and refuses
an expired one, one signed with another key, or one for another audience with `invalid_grant`.
The gateway's own calls to the same mocks are checked by `tests/tests/upstream_vertex.rs`.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import anthropic
import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from conftest import _gateway_binary
from mock_upstream import GOOGLE_CLIENT_EMAIL, GOOGLE_SCOPE, JWT_BEARER, METADATA_TOKEN, MockUpstream

# The harness' constants (tests/src/vertex.rs).
REGION = "us-east5"
PROJECT = "mock-project-zq7"
MODEL_ID = "upstream-model-zq7@20250101"
# The mocks' unscripted answers (the mock-upstream binary's, mock_upstream.py's).
TEXTS = ("This is a reply from the mock upstream to ping.", "Hello from upstream.")
MESSAGES = [{"role": "user", "content": "ping"}]


@pytest.fixture(scope="module")
def python_mock() -> Iterator[MockUpstream]:
    mock = MockUpstream()
    try:
        yield mock
    finally:
        mock.close()


@pytest.fixture(scope="module")
def rust_vertex_mock() -> Iterator[str]:
    binary = _gateway_binary().parent / "mock-upstream"
    if not binary.is_file():
        pytest.fail(f"{binary} not found; run `cargo build --workspace --bins`")
    with subprocess.Popen([str(binary)], stdout=subprocess.PIPE, text=True) as process:
        try:
            line = process.stdout.readline() if process.stdout else ""
            assert line.startswith("ready url="), f"mock-upstream said {line!r}"
            yield line.strip().removeprefix("ready url=")
        finally:
            process.kill()


@pytest.fixture(params=["python", "rust"])
def vertex_mock(request) -> str:
    if request.param == "python":
        return request.getfixturevalue("python_mock").url
    return request.getfixturevalue("rust_vertex_mock")


def metadata_token(url: str) -> str:
    with httpx.Client(trust_env=False) as client:
        refused = client.get(f"{url}{METADATA_TOKEN}")
        assert refused.status_code == 403, "the metadata server wants Metadata-Flavor"
        answer = client.get(f"{url}{METADATA_TOKEN}", headers={"Metadata-Flavor": "Google"})
    assert answer.status_code == 200, answer.text
    token = answer.json()
    assert token["token_type"] == "Bearer" and token["expires_in"] > 3000, token
    return token["access_token"]


def vertex_client(url: str, token: str) -> anthropic.AnthropicVertex:
    return anthropic.AnthropicVertex(
        region=REGION, project_id=PROJECT, access_token=token, base_url=f"{url}/v1", max_retries=0
    )


def test_anthropic_vertex_gets_a_message_and_a_stream_from_the_vertex_mock(vertex_mock):
    client = vertex_client(vertex_mock, metadata_token(vertex_mock))
    message = client.messages.create(model=MODEL_ID, max_tokens=100, messages=MESSAGES)
    assert message.content[0].text in TEXTS and message.stop_reason == "end_turn", message
    with client.messages.stream(model=MODEL_ID, max_tokens=100, messages=MESSAGES) as stream:
        assert stream.get_final_text() == message.content[0].text
        final = stream.get_final_message()
    assert final.usage.output_tokens == message.usage.output_tokens > 0


def test_the_vertex_mock_refuses_a_token_it_never_granted_with_googles_401(vertex_mock):
    client = vertex_client(vertex_mock, "ya29.forged-token")
    with pytest.raises(anthropic.AuthenticationError) as refused:
        client.messages.create(model=MODEL_ID, max_tokens=100, messages=MESSAGES)
    assert refused.value.status_code == 401
    assert refused.value.body["error"]["status"] == "UNAUTHENTICATED", refused.value.body


def assertion(token_uri: str, key: rsa.RSAPrivateKey, *, exp_in: int = 3590, scope: str = GOOGLE_SCOPE) -> str:
    now = int(time.time())
    claims = {"iss": GOOGLE_CLIENT_EMAIL, "scope": scope, "aud": token_uri, "iat": now - 10, "exp": now + exp_in}
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": "0123456789abcdef"})


def test_the_python_mocks_token_endpoint_verifies_the_service_accounts_jwt_as_google_does(python_mock):
    token_uri = python_mock.key_file()["token_uri"]

    def exchange(signed: str) -> httpx.Response:
        with httpx.Client(trust_env=False) as client:
            return client.post(token_uri, data={"grant_type": JWT_BEARER, "assertion": signed})

    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    refused = {
        "expired": assertion(token_uri, python_mock.google_key, exp_in=-5),
        "another key": assertion(token_uri, other_key),
        "another audience": assertion("https://oauth2.googleapis.com/token", python_mock.google_key),
        "another scope": assertion(token_uri, python_mock.google_key, scope="https://www.googleapis.com/auth/drive"),
    }
    for why, signed in refused.items():
        answer = exchange(signed)
        assert answer.status_code == 400 and answer.json()["error"] == "invalid_grant", (why, answer.text)
    granted = exchange(assertion(token_uri, python_mock.google_key))
    assert granted.status_code == 200, granted.text
    client = vertex_client(python_mock.url, granted.json()["access_token"])
    message = client.messages.create(model=MODEL_ID, max_tokens=100, messages=MESSAGES)
    assert message.content[0].text in TEXTS
