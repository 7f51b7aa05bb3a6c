"""The official OpenAI Python SDK works against the gateway's /v1/chat/completions surface.

Every test uses `openai.OpenAI(base_url=<gateway>/v1, api_key=<key>, max_retries=0)`.
"""

from __future__ import annotations

import json

import openai
import pytest

from support import (
    EMBEDDING_MODELS,
    SIMULATED_PREFIX,
    TOOL_RESULT_TEXT,
    VIRTUAL_MODELS,
    WEATHER_INPUT,
    WEATHER_SCHEMA,
    requests_used_in_a_fresh_window,
    said,
)

MODEL = "svc/sonnet"
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather forecast for a city", "parameters": WEATHER_SCHEMA},
}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def credits_of(usage) -> int:
    """`credits_consumed` is a service extension, so the SDK keeps it among the model's extras."""
    extras = usage.model_extra or {}
    assert "credits_consumed" in extras, f"usage without credits_consumed: {usage!r}"
    return extras["credits_consumed"]


@pytest.fixture(scope="module")
def client(api_url: str, api_key: str):
    with openai.OpenAI(base_url=api_url + "/v1", api_key=api_key, max_retries=0, timeout=30) as c:
        yield c


def client_for(api_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=api_url + "/v1", api_key=key, max_retries=0, timeout=30)


# --- plain completions ---------------------------------------------------------------------


def test_a_non_streamed_completion_has_a_chatcmpl_id_one_choice_and_usage_with_credits(client):
    completion = client.chat.completions.create(model=MODEL, max_tokens=256, messages=user("Hello there"))

    assert completion.id.startswith("chatcmpl_")
    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    assert completion.created > 0
    assert len(completion.choices) == 1
    choice = completion.choices[0]
    assert choice.index == 0
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content.startswith(SIMULATED_PREFIX)
    assert choice.message.content.endswith(said("Hello there"))
    usage = completion.usage
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= 256
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert credits_of(usage) > 0


@pytest.mark.parametrize("model", sorted(VIRTUAL_MODELS))
def test_every_virtual_model_answers_under_the_id_that_was_requested(client, model):
    completion = client.chat.completions.create(model=model, max_tokens=128, messages=user("Which model?"))

    assert completion.model == model
    assert completion.choices[0].message.content.endswith(said("Which model?"))


def test_a_multi_turn_conversation_with_a_system_message(client):
    completion = client.chat.completions.create(
        model=MODEL,
        max_tokens=256,
        messages=[
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": "Hello Ada."},
            {"role": "user", "content": "What is my name?"},
        ],
    )
    bare = client.chat.completions.create(model=MODEL, max_tokens=256, messages=user("What is my name?"))

    assert completion.choices[0].message.content.endswith(said("What is my name?"))
    assert completion.usage.prompt_tokens > bare.usage.prompt_tokens


def test_an_image_url_with_a_data_url_is_accepted(client, png_base64):
    completion = client.chat.completions.create(
        model=MODEL,
        max_tokens=256,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe this image"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png_base64}"}},
                ],
            }
        ],
    )

    assert completion.choices[0].message.content.endswith(said("Describe this image"))


@pytest.mark.parametrize("limit", ["max_tokens", "max_completion_tokens"])
def test_both_max_tokens_and_max_completion_tokens_cap_the_completion(client, limit):
    completion = client.chat.completions.create(model=MODEL, messages=user("Tell me a long story"), **{limit: 3})

    assert completion.choices[0].finish_reason == "length"
    assert 0 < completion.usage.completion_tokens <= 3


def test_a_request_without_any_max_tokens_works(client):
    completion = client.chat.completions.create(model=MODEL, messages=user("No limit given"))

    assert completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].message.content.endswith(said("No limit given"))


def test_stop_cuts_the_completion(client):
    completion = client.chat.completions.create(
        model=MODEL, max_tokens=256, messages=user("Stop here"), stop=["You said"]
    )

    assert completion.choices[0].finish_reason == "stop"
    assert "You said" not in completion.choices[0].message.content


def test_every_v1_response_carries_the_rate_limit_headers_of_the_key_tier(client):
    raw = client.chat.completions.with_raw_response.create(model=MODEL, max_tokens=64, messages=user("headers"))

    assert raw.headers["x-ratelimit-tier"] == "high_volume"
    assert raw.headers["x-ratelimit-limit-requests"] == "300"
    assert 0 <= int(raw.headers["x-ratelimit-remaining-requests"]) < 300
    assert raw.parse().id.startswith("chatcmpl_")


# --- streaming -----------------------------------------------------------------------------


def test_a_streamed_completion_assembles_text_from_deltas_and_ends_with_a_usage_chunk(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            max_tokens=256,
            messages=user("Stream me"),
            stream=True,
            stream_options={"include_usage": True},
        )
    )

    assert chunks, "the stream carries chunks before data: [DONE]"
    assert all(chunk.id.startswith("chatcmpl_") for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1
    assert all(chunk.object == "chat.completion.chunk" and chunk.model == MODEL for chunk in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith(SIMULATED_PREFIX)
    assert text.endswith(said("Stream me"))
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.prompt_tokens > 0
    assert last.usage.completion_tokens > 0
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert credits_of(last.usage) > 0
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_a_streamed_completion_without_include_usage_has_no_usage_chunk(client):
    chunks = list(client.chat.completions.create(model=MODEL, max_tokens=64, messages=user("Quiet"), stream=True))

    assert chunks
    assert all(chunk.usage is None for chunk in chunks)
    assert all(chunk.choices for chunk in chunks)


def test_streamed_and_plain_completions_agree(client):
    plain = client.chat.completions.create(model=MODEL, max_tokens=256, messages=user("Same either way"))
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            max_tokens=256,
            messages=user("Same either way"),
            stream=True,
            stream_options={"include_usage": True},
        )
    )

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert credits_of(chunks[-1].usage) == credits_of(plain.usage)


# --- tools ---------------------------------------------------------------------------------


def test_tool_calls_carry_call_ids_and_round_trip_call_then_tool_message_then_final_answer(client):
    history = user("Please call get_weather for Paris")
    first = client.chat.completions.create(model=MODEL, max_tokens=512, tools=[WEATHER_TOOL], messages=history)

    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == WEATHER_INPUT

    history = history + [choice.message, {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT_TEXT}]
    second = client.chat.completions.create(model=MODEL, max_tokens=512, tools=[WEATHER_TOOL], messages=history)

    assert second.choices[0].finish_reason == "stop"
    assert not second.choices[0].message.tool_calls
    assert TOOL_RESULT_TEXT in second.choices[0].message.content


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}], ids=["required", "named"]
)
def test_tool_choice_required_or_named_forces_a_tool_call(client, tool_choice):
    completion = client.chat.completions.create(
        model=MODEL, max_tokens=512, tools=[WEATHER_TOOL], tool_choice=tool_choice, messages=user("Nothing special")
    )

    assert completion.choices[0].finish_reason == "tool_calls"
    (call,) = completion.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == WEATHER_INPUT


def test_streamed_tool_call_argument_fragments_assemble_into_json(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            max_tokens=512,
            tools=[WEATHER_TOOL],
            messages=user("Please call get_weather for Paris"),
            stream=True,
        )
    )

    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            if delta.id:
                call["id"] = delta.id
            if delta.function and delta.function.name:
                call["name"] += delta.function.name
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments

    assert list(calls) == [0]
    assert calls[0]["id"]
    assert calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == WEATHER_INPUT
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]


# --- models --------------------------------------------------------------------------------


def test_models_list_offers_the_five_virtual_models_and_svc_embed(client):
    models = list(client.models.list())

    assert {model.id for model in models} == VIRTUAL_MODELS | EMBEDDING_MODELS
    for model in models:
        assert model.object == "model"
        assert model.owned_by
        assert model.created > 0


# --- errors --------------------------------------------------------------------------------


def test_an_unknown_model_is_a_bad_request(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="svc/unknown", max_tokens=16, messages=user("Hi"))
    assert err.value.type == "invalid_request_error"


def test_max_tokens_above_the_model_limit_is_a_bad_request(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="svc/haiku", max_tokens=8_193, messages=user("Hi"))
    assert err.value.type == "invalid_request_error"


def test_an_invalid_key_is_an_authentication_error(api_url):
    with client_for(api_url, "sk-svc-not-a-real-key") as bad, pytest.raises(openai.AuthenticationError) as err:
        bad.chat.completions.create(model=MODEL, max_tokens=16, messages=user("Hi"))
    assert err.value.type == "authentication_error"


def test_a_cli_key_on_v1_is_permission_denied(api_url, cli_key):
    with client_for(api_url, cli_key) as cli, pytest.raises(openai.PermissionDeniedError) as err:
        cli.chat.completions.create(model=MODEL, max_tokens=16, messages=user("Hi"))
    assert err.value.type == "permission_error"


def test_the_sixth_request_in_a_minute_on_a_free_key_is_rate_limited(api_url, free_key):
    with client_for(api_url, free_key) as free:
        used = requests_used_in_a_fresh_window(
            lambda: free.chat.completions.with_raw_response.create(
                model="svc/haiku", max_tokens=16, messages=user("Hi")
            )
        )
        for _ in range(5 - used):
            free.chat.completions.create(model="svc/haiku", max_tokens=16, messages=user("Hi"))
        with pytest.raises(openai.RateLimitError) as err:
            free.chat.completions.create(model="svc/haiku", max_tokens=16, messages=user("Hi"))

    assert err.value.type == "rate_limit_error"
    assert 1 <= int(err.value.response.headers["retry-after"]) <= 60


def test_an_account_without_credits_gets_402_insufficient_quota(api_url, poor_key):
    with client_for(api_url, poor_key) as poor, pytest.raises(openai.APIStatusError) as err:
        poor.chat.completions.create(model=MODEL, max_tokens=16, messages=user("Hi"))

    assert err.value.status_code == 402
    assert err.value.type == "insufficient_quota"
