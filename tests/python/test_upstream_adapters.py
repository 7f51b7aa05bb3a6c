"""The official SDKs carry a multi-turn, tool-using, streamed conversation through each upstream
adapter: a gateway whose models are all routed to a scripted mock upstream (`mock_upstream.py`)
through the `anthropic`, the `openai`, the `azure-openai`, the `bedrock`, the `gemini` or the
`vertex` adapter. The mock answers the first turn with a tool call and the second, after the tool
result, with text.

Before that, the mocks themselves are checked with the provider's own client where the wire
format is not the one the gateway serves: `openai`'s `AzureOpenAI` against both the Python
mock and the Rust one the e2e tests use (`tests/src/upstream.rs`, run as the `mock-upstream`
binary next to the gateway binary), for chat completions and for embeddings (`OpenAI` too);
then `svc/embed` through each adapter (routed to the mock's embeddings where the provider has
them, else on its simulated upstream).
"""

from __future__ import annotations

import json
import struct
import subprocess
from collections.abc import Iterator

import anthropic
import openai
import pytest

from conftest import DEV_KEY, _gateway_binary
from mock_upstream import (
    AZURE_API_VERSION,
    AZURE_PREFIX,
    AWS_ACCESS_KEY_ID,
    BEDROCK_PREFIX,
    EMBEDDING_TOKENS_PER_INPUT,
    GEMINI_PREFIX,
    UPSTREAM_KEY,
    VERTEX_MODEL_ID,
    VERTEX_PREFIX,
    VERTEX_PROJECT,
    VERTEX_REGION,
    UPSTREAM_MODEL,
    MockUpstream,
)
from support import WEATHER_SCHEMA

MODEL = "svc/sonnet"
TOOL_INPUT = {"city": "Oslo", "days": 2, "metric": True}
ANSWER = "Sunny in Oslo for two days."
LEAKS = ("anthropic", "openai", "azure", "bedrock", "amazon", "gemini", "vertex", "google", UPSTREAM_MODEL, UPSTREAM_KEY)
# The wire formats: Bedrock's and Vertex's bodies are the Messages API's.
MESSAGES_FORMAT = ("anthropic", "bedrock", "vertex")


def assert_clean(payload: str) -> None:
    lower = payload.lower()
    for word in LEAKS:
        assert word not in lower, f"response names {word!r}: {payload}"


def assert_azure_call(adapter: str, mock: MockUpstream) -> None:
    """An azure-openai route's call went to the deployment, with the api-version and the key in
    `api-key` (the mock refuses any other, so an answer already says so; this says it was Azure's
    path that answered)."""
    if adapter != "azure-openai":
        return
    path, headers = mock.last_path(), mock.last_headers()
    assert path == f"{AZURE_PREFIX}{UPSTREAM_MODEL}/chat/completions?api-version={AZURE_API_VERSION}"
    assert headers["api-key"] == UPSTREAM_KEY and "authorization" not in headers


def assert_upstream_model(adapter: str, mock: MockUpstream) -> None:
    """The upstream's own model name went out: in the body, or for Bedrock in the path (escaped
    as one segment), with a SigV4 signature the mock checked and the Messages body Bedrock takes; for
    Gemini in the path too, with the key in `x-goog-api-key`; for Vertex in the path with the
    project and region, with a token from the mock's token endpoint."""
    if adapter == "gemini":
        path, headers = mock.last_path(), mock.last_headers()
        assert path == f"{GEMINI_PREFIX}{UPSTREAM_MODEL}:streamGenerateContent?alt=sse", path
        assert headers["x-goog-api-key"] == UPSTREAM_KEY and "authorization" not in headers
        assert "model" not in mock.last_body()
        return
    if adapter == "vertex":
        path, headers, sent = mock.last_path(), mock.last_headers(), mock.last_body()
        models = f"{VERTEX_PREFIX}{VERTEX_PROJECT}/locations/{VERTEX_REGION}/publishers/anthropic/models"
        assert path == f"{models}/{VERTEX_MODEL_ID}:streamRawPredict", path
        assert headers["authorization"].startswith("Bearer ya29.mock-key_file-")
        assert sent["anthropic_version"] == "vertex-2023-10-16" and "model" not in sent and sent["stream"] is True
        return
    if adapter != "bedrock":
        assert mock.last_body()["model"] == UPSTREAM_MODEL
        return
    path, headers, sent = mock.last_path(), mock.last_headers(), mock.last_body()
    assert path == f"{BEDROCK_PREFIX}anthropic.upstream-model-zq7-v1%3A0/invoke-with-response-stream", path
    assert headers["authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={AWS_ACCESS_KEY_ID}/")
    assert sent["anthropic_version"] == "bedrock-2023-05-31" and "model" not in sent and "stream" not in sent


@pytest.fixture(scope="module")
def python_azure_mock() -> Iterator[str]:
    mock = MockUpstream()
    try:
        yield mock.url
    finally:
        mock.close()


@pytest.fixture(scope="module")
def rust_azure_mock() -> Iterator[str]:
    """The e2e tests' mock (`tests/src/upstream.rs`) as a process: `cargo build --workspace
    --bins` puts it next to the gateway binary."""
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
def azure_mock(request) -> str:
    return request.getfixturevalue(f"{request.param}_azure_mock")


def azure_client(url: str, *, api_key: str = UPSTREAM_KEY, api_version: str = AZURE_API_VERSION):
    return openai.AzureOpenAI(
        azure_endpoint=url, api_key=api_key, api_version=api_version, max_retries=0, timeout=30
    )


def test_the_azure_openai_client_gets_json_and_streamed_chat_completions_from_the_azure_mock(azure_mock):
    messages = [{"role": "user", "content": "Capital of France?"}]
    with azure_client(azure_mock) as client:
        answer = client.chat.completions.create(model=UPSTREAM_MODEL, messages=messages)
        assert answer.choices[0].message.content, answer
        assert answer.choices[0].finish_reason == "stop"
        assert answer.usage is not None and answer.usage.completion_tokens > 0
        assert answer.model_extra and "prompt_filter_results" in answer.model_extra, "Azure's extra field"

        stream = client.chat.completions.create(
            model=UPSTREAM_MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
    assert chunks[0].choices == [], "Azure's first chunk carries only the prompt's filter results"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == answer.usage.completion_tokens


def test_the_azure_mock_refuses_a_wrong_key_api_version_or_deployment_as_azure_does(azure_mock):
    messages = [{"role": "user", "content": "hi"}]
    with azure_client(azure_mock, api_key="not-the-key") as client:
        with pytest.raises(openai.AuthenticationError) as refused:
            client.chat.completions.create(model=UPSTREAM_MODEL, messages=messages)
    assert refused.value.status_code == 401 and "invalid subscription key" in str(refused.value)
    with azure_client(azure_mock, api_version="2023-05-15") as client:
        with pytest.raises(openai.NotFoundError, match="Resource not found"):
            client.chat.completions.create(model=UPSTREAM_MODEL, messages=messages)
    with azure_client(azure_mock) as client:
        with pytest.raises(openai.NotFoundError) as missing:
            client.chat.completions.create(model="no-such-deployment", messages=messages)
    assert missing.value.code == "DeploymentNotFound"


def f32(vector: list[float]) -> list[float]:
    return list(struct.unpack(f"<{len(vector)}f", struct.pack(f"<{len(vector)}f", *vector)))


def assert_mock_vectors(answer, texts: list[str], dimensions: int) -> None:
    """The mocks' vectors: each input's index and length, alternating, `dimensions` long."""
    assert [d.index for d in answer.data] == list(range(len(texts)))
    for d, text in zip(answer.data, texts):
        assert len(d.embedding) == dimensions
        assert d.embedding[:2] == [float(d.index), float(len(text))], d.embedding[:4]
    assert answer.usage.prompt_tokens == EMBEDDING_TOKENS_PER_INPUT * len(texts)


def test_the_openai_and_azure_openai_clients_get_float_and_base64_embeddings_from_both_mocks(azure_mock):
    texts = ["first text", "the second one"]
    with azure_client(azure_mock) as client:
        # No encoding named: the SDK asks for base64 and decodes it.
        assert_mock_vectors(client.embeddings.create(model=UPSTREAM_MODEL, input=texts), texts, 8)
        floats = client.embeddings.create(model=UPSTREAM_MODEL, input=texts, encoding_format="float", dimensions=4)
        assert_mock_vectors(floats, texts, 4)
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="no-such-deployment", input=texts)
    with openai.OpenAI(base_url=f"{azure_mock}/v1", api_key=UPSTREAM_KEY, max_retries=0, timeout=30) as client:
        one = client.embeddings.create(model=UPSTREAM_MODEL, input="alone", encoding_format="float")
        assert_mock_vectors(one, ["alone"], 8)
        assert_mock_vectors(client.embeddings.create(model=UPSTREAM_MODEL, input=texts), texts, 8)


def test_the_openai_sdk_embeds_on_svc_embed_through_each_adapter(routed):
    adapter, url, mock = routed
    texts = [f"passage {i}" for i in range(100)]
    before = len(mock.received)
    with openai.OpenAI(base_url=f"{url}/v1", api_key=DEV_KEY, max_retries=0) as client:
        raw = client.embeddings.with_raw_response.create(model="svc/embed", input=texts, dimensions=6)
        floats = client.embeddings.create(model="svc/embed", input=texts[:3], encoding_format="float", dimensions=6)
    assert_clean(raw.text)
    answer = raw.parse()
    assert answer.model == "svc/embed" and floats.model == "svc/embed"
    # The same f32s, whether JSON text (shortest form) or base64 bytes carried them.
    assert [f32(d.embedding) for d in floats.data] == [f32(d.embedding) for d in answer.data[:3]]
    if adapter in ("openai", "azure-openai"):
        assert_mock_vectors(answer, texts, 6)
        assert len(mock.received) == before + 2, "one upstream call each"
        path = mock.last_path()
        if adapter == "azure-openai":
            assert path == f"{AZURE_PREFIX}{UPSTREAM_MODEL}/embeddings?api-version={AZURE_API_VERSION}"
        else:
            assert path == "/v1/embeddings"
    else:
        # No embeddings on this provider: svc/embed stays on its simulated upstream.
        assert len(mock.received) == before, "the mock was not called"
        assert all(len(d.embedding) == 6 for d in answer.data)
        assert len({tuple(d.embedding) for d in answer.data}) == 100


def test_the_anthropic_sdk_streams_a_tool_call_then_the_answer_through_each_adapter(routed):
    adapter, url, mock = routed
    mock.push([("text", "Let me check."), ("tool", "get_weather", TOOL_INPUT)], [("text", ANSWER)])
    tools = [{"name": "get_weather", "description": "Weather forecast", "input_schema": WEATHER_SCHEMA}]
    messages: list[dict] = [{"role": "user", "content": "Weather in Oslo for two days?"}]
    with anthropic.Anthropic(base_url=url, api_key=DEV_KEY, max_retries=0, timeout=30) as client:
        with client.messages.stream(model=MODEL, max_tokens=500, tools=tools, messages=messages) as stream:
            for event in stream:
                assert_clean(event.model_dump_json())
            first = stream.get_final_message()
        assert first.model == MODEL
        assert first.stop_reason == "tool_use"
        assert [b.type for b in first.content] == ["text", "tool_use"]
        call = first.content[1]
        assert call.name == "get_weather" and call.input == TOOL_INPUT

        messages += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]},
        ]
        with client.messages.stream(model=MODEL, max_tokens=500, tools=tools, messages=messages) as stream:
            text = "".join(stream.text_stream)
            second = stream.get_final_message()
    assert text == ANSWER
    assert second.stop_reason == "end_turn"
    assert second.usage.output_tokens == 12

    sent = mock.last_body()
    assert_upstream_model(adapter, mock)
    assert_azure_call(adapter, mock)
    if adapter in MESSAGES_FORMAT:
        assert sent["messages"][2]["content"][0] == {"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}
    elif adapter == "gemini":
        assert [c["role"] for c in sent["contents"]] == ["user", "model", "user"]
        response = {"name": "get_weather", "response": {"content": "sunny"}}
        assert sent["contents"][2]["parts"][0] == {"functionResponse": response}
    else:
        assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "tool"]
        assert sent["messages"][2] == {"role": "tool", "tool_call_id": call.id, "content": "sunny"}


def test_the_anthropic_sdk_reads_an_empty_reply_as_one_empty_text_block_through_each_adapter(routed):
    _adapter, url, mock = routed
    mock.push([], [])  # replies with no block at all
    messages = [{"role": "user", "content": "Say nothing."}]
    with anthropic.Anthropic(base_url=url, api_key=DEV_KEY, max_retries=0, timeout=30) as client:
        answer = client.messages.create(model=MODEL, max_tokens=50, messages=messages)
        with client.messages.stream(model=MODEL, max_tokens=50, messages=messages) as stream:
            text = "".join(stream.text_stream)
            streamed = stream.get_final_message()
    for message in (answer, streamed):
        assert [(b.type, b.text) for b in message.content] == [("text", "")]
        assert message.content[0].text == ""
        assert message.stop_reason == "end_turn"
    assert text == ""


def test_the_openai_sdk_streams_a_tool_call_then_the_answer_through_each_adapter(routed):
    adapter, url, mock = routed
    mock.push([("tool", "get_weather", TOOL_INPUT)], [("text", ANSWER)])
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}]
    messages: list[dict] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo for two days?"},
    ]
    with openai.OpenAI(base_url=f"{url}/v1", api_key=DEV_KEY, max_retries=0, timeout=30) as client:
        calls: dict[int, dict] = {}
        finish = None
        stream = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, stream=True)
        for chunk in stream:
            assert_clean(chunk.model_dump_json())
            for choice in chunk.choices:
                for call in choice.delta.tool_calls or []:
                    entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    entry["id"] += call.id or ""
                    entry["name"] += (call.function.name or "") if call.function else ""
                    entry["arguments"] += (call.function.arguments or "") if call.function else ""
                finish = choice.finish_reason or finish
        assert finish == "tool_calls"
        assert list(calls) == [0]
        call = calls[0]
        assert call["name"] == "get_weather"
        assert json.loads(call["arguments"]) == TOOL_INPUT

        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["name"], "arguments": call["arguments"]},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
        ]
        stream = client.chat.completions.create(
            model=MODEL, messages=messages, tools=tools, stream=True, stream_options={"include_usage": True}
        )
        text, usage = "", None
        for chunk in stream:
            assert_clean(chunk.model_dump_json())
            text += "".join(c.delta.content or "" for c in chunk.choices)
            usage = chunk.usage or usage
    assert text == ANSWER
    assert usage is not None and usage.completion_tokens == 12

    sent = mock.last_body()
    assert_upstream_model(adapter, mock)
    assert_azure_call(adapter, mock)
    if adapter in MESSAGES_FORMAT:
        assert sent["system"] == "Be brief."
        assert sent["messages"][1]["content"][0]["type"] == "tool_use"
        assert sent["messages"][2]["content"][0]["tool_use_id"] == call["id"]
    elif adapter == "gemini":
        assert sent["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
        assert sent["contents"][1]["parts"][0]["functionCall"] == {"name": "get_weather", "args": TOOL_INPUT}
        assert sent["contents"][2]["parts"][0]["functionResponse"]["name"] == "get_weather"
    else:
        assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
        assert sent["messages"][2]["tool_calls"][0]["id"] == call["id"]


def test_a_reply_names_no_provider_no_upstream_model_and_no_upstream_key(routed):
    _, url, _ = routed
    with anthropic.Anthropic(base_url=url, api_key=DEV_KEY, max_retries=0, timeout=30) as client:
        raw = client.messages.with_raw_response.create(
            model="svc/haiku", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
        )
    assert_clean(raw.http_response.text)
    assert_clean(json.dumps(dict(raw.headers)))


def test_the_upstream_stops_at_the_max_tokens_it_is_sent_and_the_sdk_reads_max_tokens_through_each_adapter(routed):
    adapter, url, mock = routed
    mock.push([("text", ANSWER)], [("text", ANSWER)])
    messages = [{"role": "user", "content": "Tell me the weather."}]
    with anthropic.Anthropic(base_url=url, api_key=DEV_KEY, max_retries=0, timeout=30) as client:
        answer = client.messages.create(model=MODEL, max_tokens=5, messages=messages)
        sent = mock.last_body()
        with client.messages.stream(model=MODEL, max_tokens=5, messages=messages) as stream:
            streamed = stream.get_final_message()
    gemini_max = sent.get("generationConfig", {}).get("maxOutputTokens")
    assert sent.get("max_completion_tokens", sent.get("max_tokens", gemini_max)) == 5, (adapter, sent)
    for message in (answer, streamed):
        assert message.stop_reason == "max_tokens", (adapter, message)
        assert message.usage.output_tokens == 5
        assert "".join(b.text for b in message.content if b.type == "text") == ANSWER[:5]
