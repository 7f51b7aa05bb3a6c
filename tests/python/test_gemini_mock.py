"""Both Gemini mocks, the e2e tests' (`tests/src/gemini.rs`, run as the `mock-upstream` binary
next to the gateway binary) and the Python SDK tests' (`mock_upstream.py`), speak the Gemini
API's real wire format, as Google's own client reads it: `google-genai`'s `generate_content` and
`generate_content_stream`, with a function declaration (whose schema the mocks check as Google
does), and a function call back from the scripted Python mock. Both refuse what Google refuses:
no key (403 `PERMISSION_DENIED`), a wrong key (400 `API_KEY_INVALID`), a malformed body (400
`INVALID_ARGUMENT`). The gateway's own calls to the Rust mock are checked by
`tests/tests/upstream_gemini.rs`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import httpx
import pytest
from google import genai
from google.genai import errors, types

from conftest import _gateway_binary
from mock_upstream import UPSTREAM_KEY, UPSTREAM_MODEL, MockUpstream

WEATHER = types.FunctionDeclaration(
    name="get_weather",
    description="Current weather for a city.",
    parameters=types.Schema(
        type=types.Type.OBJECT,
        properties={
            "city": types.Schema(type=types.Type.STRING),
            "days": types.Schema(type=types.Type.INTEGER, nullable=True),
        },
        required=["city"],
    ),
)


@pytest.fixture(scope="module")
def python_gemini_mock() -> Iterator[MockUpstream]:
    mock = MockUpstream()
    try:
        yield mock
    finally:
        mock.close()


@pytest.fixture(scope="module")
def rust_gemini_mock() -> Iterator[str]:
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
def gemini_mock(request) -> str:
    mock = request.getfixturevalue(f"{request.param}_gemini_mock")
    return mock.url if isinstance(mock, MockUpstream) else mock


def client(url: str, key: str = UPSTREAM_KEY) -> genai.Client:
    """The client as the gateway calls Gemini: `v1beta` (where thinking and function ids are)."""
    retry = types.HttpRetryOptions(attempts=1)
    options = types.HttpOptions(base_url=url, api_version="v1beta", retry_options=retry, timeout=30_000)
    return genai.Client(api_key=key, http_options=options)


def test_the_google_genai_client_gets_json_and_streamed_answers_from_the_gemini_mock(gemini_mock):
    config = types.GenerateContentConfig(
        system_instruction="Be brief.",
        tools=[types.Tool(function_declarations=[WEATHER])],
        max_output_tokens=200,
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    gemini = client(gemini_mock)
    answer = gemini.models.generate_content(model=UPSTREAM_MODEL, contents="Capital of France?", config=config)
    assert answer.text, answer
    assert answer.candidates[0].finish_reason == types.FinishReason.STOP
    assert answer.usage_metadata.prompt_token_count > 0
    assert answer.usage_metadata.candidates_token_count > 0

    chunks = list(
        gemini.models.generate_content_stream(model=UPSTREAM_MODEL, contents="Capital of France?", config=config)
    )
    assert len(chunks) > 2, "the answer comes in pieces"
    assert "".join(c.text or "" for c in chunks) == answer.text
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert chunks[-1].usage_metadata.candidates_token_count == answer.usage_metadata.candidates_token_count


def test_the_google_genai_client_reads_a_function_call_and_sends_its_response_to_the_python_mock(
    python_gemini_mock,
):
    mock = python_gemini_mock
    mock.push([("tool", "get_weather", {"city": "Oslo"})], [("text", "Sunny in Oslo.")])
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[WEATHER])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    gemini = client(mock.url)
    asked = types.Content(role="user", parts=[types.Part.from_text(text="Weather in Oslo?")])
    first = gemini.models.generate_content(model=UPSTREAM_MODEL, contents=[asked], config=config)
    assert [(c.name, c.args) for c in first.function_calls] == [("get_weather", {"city": "Oslo"})]
    result = types.Part.from_function_response(name="get_weather", response={"content": "sunny"})
    history = [asked, first.candidates[0].content, types.Content(role="user", parts=[result])]
    chunks = list(gemini.models.generate_content_stream(model=UPSTREAM_MODEL, contents=history, config=config))
    assert "".join(c.text or "" for c in chunks) == "Sunny in Oslo."
    sent = mock.last_body()
    assert sent["contents"][1]["parts"][0]["functionCall"]["name"] == "get_weather"
    assert sent["contents"][2]["parts"][0]["functionResponse"] == {
        "name": "get_weather",
        "response": {"content": "sunny"},
    }
    assert sent["tools"][0]["functionDeclarations"][0]["parameters"]["type"] == "OBJECT"


def test_the_gemini_mock_refuses_a_missing_or_wrong_key_and_a_malformed_body_as_google_does(gemini_mock):
    refused = client(gemini_mock, key="not-the-key")
    with pytest.raises(errors.ClientError) as wrong:
        refused.models.generate_content(model=UPSTREAM_MODEL, contents="hi")
    assert wrong.value.code == 400 and wrong.value.status == "INVALID_ARGUMENT"
    assert "API key not valid" in wrong.value.message
    assert wrong.value.details["error"]["details"][0]["reason"] == "API_KEY_INVALID"

    url = f"{gemini_mock}/v1beta/models/{UPSTREAM_MODEL}:generateContent"
    ok = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    assert httpx.post(url, json=ok).status_code == 403, "no key: PERMISSION_DENIED"
    headers = {"x-goog-api-key": UPSTREAM_KEY}
    assert httpx.post(url, json=ok, headers=headers).status_code == 200
    malformed = [
        {"contents": [{"role": "assistant", "parts": [{"text": "hi"}]}]},
        {"contents": [{"role": "user", "parts": []}]},
        {"contents": [{"role": "user", "parts": [{"text": "hi", "inlineData": {}}]}]},
        ok | {"messages": []},
        ok | {"tools": [{"functionDeclarations": [{"name": "f", "parameters": {"oneOf": []}}]}]},
    ]
    for body in malformed:
        refused = httpx.post(url, json=body, headers=headers)
        assert refused.status_code == 400, body
        assert refused.json()["error"]["status"] == "INVALID_ARGUMENT", refused.text
