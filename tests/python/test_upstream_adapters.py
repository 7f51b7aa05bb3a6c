"""The official SDKs carry a multi-turn, tool-using, streamed conversation through each upstream
adapter: a gateway whose models are all routed to a scripted mock upstream (`mock_upstream.py`)
through the `anthropic` or the `openai` adapter. The mock answers the first turn with a tool
call and the second, after the tool result, with text.
"""

from __future__ import annotations

import json

import anthropic
import openai

from conftest import DEV_KEY
from mock_upstream import UPSTREAM_KEY, UPSTREAM_MODEL
from support import WEATHER_SCHEMA

MODEL = "svc/sonnet"
TOOL_INPUT = {"city": "Oslo", "days": 2, "metric": True}
ANSWER = "Sunny in Oslo for two days."
LEAKS = ("anthropic", "openai", UPSTREAM_MODEL, UPSTREAM_KEY)


def assert_clean(payload: str) -> None:
    lower = payload.lower()
    for word in LEAKS:
        assert word not in lower, f"response names {word!r}: {payload}"


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
    assert sent["model"] == UPSTREAM_MODEL
    if adapter == "anthropic":
        assert sent["messages"][2]["content"][0] == {"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}
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
    if adapter == "anthropic":
        assert sent["system"] == "Be brief."
        assert sent["messages"][1]["content"][0]["type"] == "tool_use"
        assert sent["messages"][2]["content"][0]["tool_use_id"] == call["id"]
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
