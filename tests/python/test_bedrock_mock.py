"""Both Bedrock mocks, the e2e tests' (`tests/src/bedrock.rs`, run as the `mock-upstream` binary
next to the gateway binary) and the Python SDK tests' (`mock_upstream.py`, which the `routed`
tests' bedrock route calls), speak Amazon Bedrock's real wire format, as AWS's own clients read it:
boto3's `bedrock-runtime` (`invoke_model`, `invoke_model_with_response_stream`, whose event
stream botocore decodes with its CRC checks) and `anthropic.AnthropicBedrock`. Both sign with
botocore's SigV4; the mocks recompute the signature (with `aws-sigv4`, and with botocore's
`SigV4Auth`) and accept them, and refuse a wrong secret key with Bedrock's
`InvalidSignatureException`, as AWS does. The gateway's
own calls to the same mock are checked by `tests/tests/upstream_bedrock.rs`.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import anthropic
import boto3
import botocore.config
import botocore.exceptions
import pytest

from conftest import _gateway_binary
from mock_upstream import MockUpstream

# The harness' constants (tests/src/bedrock.rs).
REGION = "eu-west-3"
MODEL_ID = "anthropic.upstream-model-zq7-v1:0"
ACCESS_KEY_ID = "AKIAMOCKBEDROCK00001"
SECRET_ACCESS_KEY = "upstream-secret-key-aws/Zq7mock+bedrock"
SESSION_TOKEN = "mock-session-token-8812"
# The mocks' unscripted answers (the mock-upstream binary's, mock_upstream.py's).
TEXTS = ("This is a reply from the mock upstream to ping.", "Hello from upstream.")

BODY = {
    "anthropic_version": "bedrock-2023-05-31",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "ping"}],
}


@pytest.fixture(scope="module")
def python_bedrock_mock() -> Iterator[str]:
    mock = MockUpstream()
    try:
        yield mock.url
    finally:
        mock.close()


@pytest.fixture(scope="module")
def rust_bedrock_mock() -> Iterator[str]:
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
def bedrock_mock(request) -> str:
    return request.getfixturevalue(f"{request.param}_bedrock_mock")


def runtime(url: str, *, secret: str = SECRET_ACCESS_KEY, token: str | None = SESSION_TOKEN):
    return boto3.client(
        "bedrock-runtime",
        region_name=REGION,
        endpoint_url=url,
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=secret,
        aws_session_token=token,
        config=botocore.config.Config(retries={"max_attempts": 1, "mode": "standard"}),
    )


@pytest.mark.parametrize("token", [SESSION_TOKEN, None], ids=["session", "long-term"])
def test_boto3_invokes_the_bedrock_mock_in_json_and_reads_its_event_stream(bedrock_mock, token):
    client = runtime(bedrock_mock, token=token)
    answer = client.invoke_model(
        modelId=MODEL_ID, body=json.dumps(BODY), contentType="application/json", accept="application/json"
    )
    message = json.loads(answer["body"].read())
    assert message["type"] == "message" and message["content"][0]["text"] in TEXTS, message
    assert message["stop_reason"] == "end_turn" and message["usage"]["output_tokens"] > 0

    streamed = client.invoke_model_with_response_stream(
        modelId=MODEL_ID, body=json.dumps(BODY), contentType="application/json"
    )
    assert streamed["contentType"] == "application/json", "the chunks' type"
    events = [json.loads(event["chunk"]["bytes"]) for event in streamed["body"]]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == message["content"][0]["text"]
    metrics = events[-1]["amazon-bedrock-invocationMetrics"]
    assert metrics["outputTokenCount"] == message["usage"]["output_tokens"], metrics


def test_the_bedrock_mock_refuses_a_signature_made_with_another_secret_key_as_bedrock_does(bedrock_mock):
    client = runtime(bedrock_mock, secret="upstream-secret-key-aws/not-the-right-one")
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        client.invoke_model(modelId=MODEL_ID, body=json.dumps(BODY))
    error = refused.value.response
    assert error["Error"]["Code"] == "InvalidSignatureException", error
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(botocore.exceptions.ClientError, match="ValidationException"):
        runtime(bedrock_mock).invoke_model(modelId=MODEL_ID, body=json.dumps({**BODY, "stream": True}))


def test_anthropic_bedrock_gets_a_message_and_a_stream_from_the_bedrock_mock(bedrock_mock):
    client = anthropic.AnthropicBedrock(
        aws_access_key=ACCESS_KEY_ID,
        aws_secret_key=SECRET_ACCESS_KEY,
        aws_session_token=SESSION_TOKEN,
        aws_region=REGION,
        base_url=bedrock_mock,
        max_retries=0,
    )
    messages = [{"role": "user", "content": "ping"}]
    message = client.messages.create(model=MODEL_ID, max_tokens=100, messages=messages)
    assert message.content[0].text in TEXTS and message.stop_reason == "end_turn"
    with client.messages.stream(model=MODEL_ID, max_tokens=100, messages=messages) as stream:
        assert stream.get_final_text() == message.content[0].text
        final = stream.get_final_message()
    assert final.usage.output_tokens == message.usage.output_tokens
