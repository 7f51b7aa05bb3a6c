"""The official Anthropic Python SDK works against the gateway's /v1/messages surface unchanged.

Every test uses `anthropic.Anthropic(base_url=<gateway>, api_key=<key>, max_retries=0)`, so a
failure is what a user of the SDK would see.
"""

from __future__ import annotations

import asyncio
import json

import anthropic
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
WEATHER_TOOL = {"name": "get_weather", "description": "Weather forecast for a city", "input_schema": WEATHER_SCHEMA}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def credits_of(usage) -> int:
    """`credits_consumed` is a service extension, so the SDK keeps it among the model's extras."""
    extras = usage.model_extra or {}
    assert "credits_consumed" in extras, f"usage without credits_consumed: {usage!r}"
    return extras["credits_consumed"]


@pytest.fixture(scope="module")
def client(api_url: str, api_key: str):
    with anthropic.Anthropic(base_url=api_url, api_key=api_key, max_retries=0, timeout=30) as c:
        yield c


def client_for(api_url: str, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=api_url, api_key=key, max_retries=0, timeout=30)


# --- plain turns ---------------------------------------------------------------------------


def test_a_non_streamed_turn_returns_one_assistant_message_with_usage_and_credits(client):
    message = client.messages.create(model=MODEL, max_tokens=256, messages=user("Hello there"))

    assert message.id.startswith("msg_")
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.model == MODEL
    assert message.stop_reason == "end_turn"
    assert message.stop_sequence is None
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text.startswith(SIMULATED_PREFIX)
    assert message.content[0].text.endswith(said("Hello there"))
    usage = message.usage
    assert usage.input_tokens > 0
    assert 0 < usage.output_tokens <= 256
    assert usage.cache_creation_input_tokens == 0
    assert usage.cache_read_input_tokens == 0
    assert credits_of(usage) > 0


@pytest.mark.parametrize("model", sorted(VIRTUAL_MODELS))
def test_every_virtual_model_answers_under_the_id_that_was_requested(client, model):
    message = client.messages.create(model=model, max_tokens=128, messages=user("Which model?"))

    assert message.model == model
    assert text_of(message).endswith(said("Which model?"))


def test_every_v1_response_carries_the_rate_limit_headers_of_the_key_tier(client):
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=64, messages=user("headers"))

    assert raw.headers["x-ratelimit-tier"] == "high_volume"
    assert raw.headers["x-ratelimit-limit-requests"] == "300"
    assert 0 <= int(raw.headers["x-ratelimit-remaining-requests"]) < 300
    assert 0 <= int(raw.headers["x-ratelimit-reset-requests"]) <= 60
    assert raw.parse().model == MODEL


def test_max_tokens_caps_the_generated_tokens_and_sets_stop_reason_max_tokens(client):
    message = client.messages.create(model=MODEL, max_tokens=3, messages=user("Tell me a long story"))

    assert message.stop_reason == "max_tokens"
    assert 0 < message.usage.output_tokens <= 3


def test_a_190k_conversation_with_max_tokens_32000_is_served_to_the_end_of_the_window(api_url, mint_key, admin):
    """Input plus max_tokens past the 200,000-token window is served, not refused: generation is
    capped to the room the input leaves and ends with `model_context_window_exceeded`, billed
    the tokens generated (the simulated reply repeats the prompt, so it fills the room)."""
    key = mint_key(tier="high_volume")
    text = " ".join(["word"] * 190_000)
    with anthropic.Anthropic(base_url=api_url, api_key=key.key, max_retries=0, timeout=120) as client:
        counted = client.messages.count_tokens(model=MODEL, messages=user(text)).input_tokens
        assert counted + 32_000 > 200_000 > counted
        message = client.messages.create(model=MODEL, max_tokens=32_000, messages=user(text))
    assert message.stop_reason == "model_context_window_exceeded"
    assert message.usage.input_tokens == counted
    assert message.usage.output_tokens == 200_000 - counted
    row = admin.get(f"/admin/messages/{message.id}").json()
    assert row["stop_reason"] == "model_context_window_exceeded", row
    assert row["usage"]["output_tokens"] == message.usage.output_tokens, row
    assert row["billed"] == credits_of(message.usage), row


def test_a_stop_sequence_in_the_reply_cuts_it_and_is_reported(client):
    message = client.messages.create(
        model=MODEL, max_tokens=256, messages=user("Stop here"), stop_sequences=["You said"]
    )

    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == "You said"
    assert "You said" not in text_of(message)


def test_a_multi_turn_conversation_is_answered_from_the_last_user_turn(client):
    history = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": "What is my name?"},
    ]
    multi = client.messages.create(model=MODEL, max_tokens=256, messages=history)
    single = client.messages.create(model=MODEL, max_tokens=256, messages=user("What is my name?"))

    assert text_of(multi).endswith(said("What is my name?"))
    assert multi.usage.input_tokens > single.usage.input_tokens


def test_a_system_prompt_is_accepted_and_counted_as_input(client):
    with_system = client.messages.create(
        model=MODEL,
        max_tokens=256,
        system="You are a terse assistant that answers in one sentence.",
        messages=user("Hi"),
    )
    without = client.messages.create(model=MODEL, max_tokens=256, messages=user("Hi"))

    assert text_of(with_system).endswith(said("Hi"))
    assert with_system.usage.input_tokens > without.usage.input_tokens


def test_an_image_block_is_accepted_on_a_vision_model(client, png_base64):
    message = client.messages.create(
        model=MODEL,
        max_tokens=256,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png_base64}},
                    {"type": "text", "text": "Describe this image"},
                ],
            }
        ],
    )

    assert text_of(message).endswith(said("Describe this image"))
    assert message.usage.input_tokens > 0


def test_metadata_and_cache_control_blocks_are_accepted(client):
    message = client.messages.create(
        model=MODEL,
        max_tokens=256,
        metadata={"user_id": "user-42"},
        system=[{"type": "text", "text": "A long, cacheable system prompt.", "cache_control": {"type": "ephemeral"}}],
        tools=[{**WEATHER_TOOL, "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Cache me", "cache_control": {"type": "ephemeral"}}]}
        ],
    )

    assert text_of(message).endswith(said("Cache me"))
    # The simulated upstream keeps no cache: both counts are reported, and zero.
    assert message.usage.cache_creation_input_tokens == 0
    assert message.usage.cache_read_input_tokens == 0


def test_the_sdk_top_level_cache_control_parameter_is_accepted(client):
    message = client.messages.create(
        model=MODEL, max_tokens=64, cache_control={"type": "ephemeral"}, messages=user("Auto cache")
    )

    assert text_of(message).endswith(said("Auto cache"))


# --- streaming ---------------------------------------------------------------------------


def test_create_with_stream_true_yields_the_event_sequence_and_bills_in_message_delta(client):
    events = list(client.messages.create(model=MODEL, max_tokens=256, messages=user("Stream me"), stream=True))
    types = [event.type for event in events]

    assert types[0] == "message_start"
    assert types[-1] == "message_stop"
    assert "content_block_start" in types and "content_block_stop" in types
    start = events[0].message
    assert start.id.startswith("msg_")
    assert start.model == MODEL
    assert start.role == "assistant"
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert text.startswith(SIMULATED_PREFIX)
    assert text.endswith(said("Stream me"))
    (delta,) = [e for e in events if e.type == "message_delta"]
    assert delta.delta.stop_reason == "end_turn"
    assert delta.usage.output_tokens > 0
    assert credits_of(delta.usage) > 0


def test_the_stream_helper_assembles_the_same_message_as_a_non_streamed_turn(client):
    with client.messages.stream(model=MODEL, max_tokens=256, messages=user("Same either way")) as stream:
        streamed_text = "".join(stream.text_stream)
        final = stream.get_final_message()
    plain = client.messages.create(model=MODEL, max_tokens=256, messages=user("Same either way"))

    assert final.id.startswith("msg_")
    assert final.model == MODEL
    assert final.stop_reason == "end_turn"
    assert text_of(final) == streamed_text == text_of(plain)
    assert final.usage.input_tokens == plain.usage.input_tokens
    assert final.usage.output_tokens == plain.usage.output_tokens


def test_the_stream_helper_exposes_credits_consumed_on_the_message_delta_event(client):
    with client.messages.stream(model=MODEL, max_tokens=256, messages=user("Count my credits")) as stream:
        deltas = [event for event in stream if event.type == "message_delta"]
        final = stream.get_final_message()

    assert len(deltas) == 1
    assert credits_of(deltas[0].usage) > 0
    assert final.usage.output_tokens == deltas[0].usage.output_tokens
    plain = client.messages.create(model=MODEL, max_tokens=256, messages=user("Count my credits"))
    assert credits_of(deltas[0].usage) == credits_of(plain.usage)


# --- tools ---------------------------------------------------------------------------------


def tool_round_trip_history(first_content, tool_use_id: str) -> list[dict]:
    return [
        {"role": "user", "content": "Please call get_weather for Paris"},
        {"role": "assistant", "content": first_content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_use_id, "content": TOOL_RESULT_TEXT}],
        },
    ]


def test_tool_use_round_trip_tool_call_then_tool_result_then_final_text(client):
    first = client.messages.create(
        model=MODEL, max_tokens=512, tools=[WEATHER_TOOL], messages=user("Please call get_weather for Paris")
    )

    assert first.stop_reason == "tool_use"
    (call,) = [block for block in first.content if block.type == "tool_use"]
    assert call.name == "get_weather"
    assert call.id
    assert call.input == WEATHER_INPUT

    second = client.messages.create(
        model=MODEL, max_tokens=512, tools=[WEATHER_TOOL], messages=tool_round_trip_history(first.content, call.id)
    )

    assert second.stop_reason == "end_turn"
    assert [block.type for block in second.content] == ["text"]
    assert TOOL_RESULT_TEXT in text_of(second)


@pytest.mark.parametrize("tool_choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_tool_choice_any_or_named_forces_a_tool_call(client, tool_choice):
    message = client.messages.create(
        model=MODEL, max_tokens=512, tools=[WEATHER_TOOL], tool_choice=tool_choice, messages=user("Nothing special")
    )

    assert message.stop_reason == "tool_use"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather"
    assert call.input == WEATHER_INPUT


def test_a_streamed_tool_call_assembles_its_input_from_input_json_delta_fragments(client):
    events = list(
        client.messages.create(
            model=MODEL,
            max_tokens=512,
            tools=[WEATHER_TOOL],
            messages=user("Please call get_weather for Paris"),
            stream=True,
        )
    )

    starts = [e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use"]
    assert len(starts) == 1
    block = starts[0].content_block
    assert block.name == "get_weather"
    assert block.id
    fragments = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.index == starts[0].index and e.delta.type == "input_json_delta"
    ]
    assert fragments, "a tool_use block streams its input as input_json_delta events"
    assert json.loads("".join(fragments)) == WEATHER_INPUT
    (delta,) = [e for e in events if e.type == "message_delta"]
    assert delta.delta.stop_reason == "tool_use"


def test_a_streamed_tool_round_trip_with_the_stream_helper(client):
    with client.messages.stream(
        model=MODEL, max_tokens=512, tools=[WEATHER_TOOL], messages=user("Please call get_weather for Paris")
    ) as stream:
        first = stream.get_final_message()
    (call,) = [block for block in first.content if block.type == "tool_use"]
    assert first.stop_reason == "tool_use"
    assert call.input == WEATHER_INPUT

    with client.messages.stream(
        model=MODEL, max_tokens=512, tools=[WEATHER_TOOL], messages=tool_round_trip_history(first.content, call.id)
    ) as stream:
        second = stream.get_final_message()

    assert second.stop_reason == "end_turn"
    assert TOOL_RESULT_TEXT in text_of(second)


# --- thinking ------------------------------------------------------------------------------


def test_extended_thinking_on_opus_returns_a_signed_thinking_block_before_the_text(client):
    message = client.messages.create(
        model="svc/opus",
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=user("Think first"),
    )

    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking
    assert message.content[0].signature
    assert message.content[1].text.endswith(said("Think first"))
    assert message.usage.output_tokens <= 2048


def test_streamed_thinking_arrives_as_thinking_and_signature_deltas(client):
    with client.messages.stream(
        model="svc/opus",
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=user("Think while streaming"),
    ) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_message()

    assert {"thinking", "signature", "text"} <= kinds
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking and final.content[0].signature
    assert text_of(final).endswith(said("Think while streaming"))


def test_thinking_on_a_model_without_it_is_accepted_and_left_out(client):
    message = client.messages.create(
        model="svc/haiku",
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=user("Think"),
    )
    assert [block.type for block in message.content] == ["text"]
    assert text_of(message).endswith(said("Think"))


# --- token counting, models, beta, async ---------------------------------------------------


def test_count_tokens_matches_the_input_tokens_a_turn_is_charged_for(client):
    short = client.messages.count_tokens(model=MODEL, messages=user("Hi"))
    long = client.messages.count_tokens(model=MODEL, messages=user("Hi " * 200), system="Be brief.")
    turn = client.messages.create(model=MODEL, max_tokens=32, messages=user("Hi"))

    assert short.input_tokens > 0
    assert long.input_tokens > short.input_tokens + 100
    assert short.input_tokens == turn.usage.input_tokens


def test_models_list_offers_the_five_virtual_models_with_their_limits_and_svc_embed(client):
    models = {model.id: model for model in client.models.list()}

    assert set(models) == VIRTUAL_MODELS | EMBEDDING_MODELS
    embed = models.pop("svc/embed").model_dump(warnings=False)
    assert embed["capabilities"]["embeddings"] is True and embed["max_output_tokens"] == 0, embed
    for model in models.values():
        assert model.type == "model"
        assert model.display_name
        extras = model.model_extra or {}
        assert extras["context_window"] > 0
        assert extras["max_output_tokens"] > 0
    assert (models["svc/opus"].model_extra["context_window"], models["svc/opus"].model_extra["max_output_tokens"]) == (
        200_000,
        32_000,
    )
    assert models["svc/haiku"].model_extra["max_output_tokens"] == 8_192
    assert models["svc/kimi"].model_extra["context_window"] == 131_072


def test_models_retrieve_accepts_an_id_with_a_slash(client):
    # The SDK percent-encodes the slash: GET /v1/models/svc%2Fopus
    model = client.models.retrieve("svc/opus")

    assert model.id == "svc/opus"
    assert model.model_extra["max_output_tokens"] == 32_000


def test_the_beta_namespace_sends_anthropic_beta_headers_and_is_served(client):
    raw = client.beta.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=128,
        messages=user("Beta hello"),
        betas=["prompt-caching-2024-07-31", "token-efficient-tools-2025-02-19"],
    )
    message = raw.parse()

    assert raw.http_request.headers["anthropic-beta"] == "prompt-caching-2024-07-31,token-efficient-tools-2025-02-19"
    assert message.id.startswith("msg_")
    assert text_of(message).endswith(said("Beta hello"))


def test_the_beta_true_query_that_older_sdks_and_claude_code_send_is_served(client):
    # anthropic-python 2.x keeps `beta=true` as request metadata; earlier SDKs and Claude Code
    # put it in the query string, so the gateway must take POST /v1/messages?beta=true as well.
    raw = client.beta.messages.with_raw_response.create(
        model=MODEL, max_tokens=128, messages=user("Beta query"), extra_query={"beta": "true"}
    )

    assert "beta=true" in str(raw.http_request.url)
    assert text_of(raw.parse()).endswith(said("Beta query"))
    with client.beta.messages.stream(
        model=MODEL, max_tokens=128, messages=user("Beta stream"), extra_query={"beta": "true"}
    ) as stream:
        assert text_of(stream.get_final_message()).endswith(said("Beta stream"))


def test_the_async_client_creates_and_streams(api_url, api_key):
    async def scenario():
        async with anthropic.AsyncAnthropic(base_url=api_url, api_key=api_key, max_retries=0, timeout=30) as client:
            plain = await client.messages.create(model=MODEL, max_tokens=128, messages=user("Async hello"))
            async with client.messages.stream(model=MODEL, max_tokens=128, messages=user("Async hello")) as stream:
                streamed = await stream.get_final_message()
            return plain, streamed

    plain, streamed = asyncio.run(scenario())

    assert text_of(plain).endswith(said("Async hello"))
    assert text_of(streamed) == text_of(plain)


# --- errors: each status maps to the SDK's own exception class -----------------------------


def test_an_unknown_model_is_a_bad_request(client):
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="svc/unknown", max_tokens=16, messages=user("Hi"))
    assert err.value.type == "invalid_request_error"
    assert "model" in err.value.api_message


def test_max_tokens_above_the_model_limit_is_a_bad_request(client):
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="svc/haiku", max_tokens=8_193, messages=user("Hi"))
    assert err.value.type == "invalid_request_error"
    assert "max_tokens" in err.value.api_message


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "assistant", "content": "I speak first"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "and I end"}],
    ],
    ids=["empty", "assistant-first", "ends-with-assistant"],
)
def test_a_mis_shaped_messages_array_is_a_bad_request(client, messages):
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=MODEL, max_tokens=16, messages=messages)
    assert err.value.type == "invalid_request_error"


def test_more_than_four_stop_sequences_is_a_bad_request(client):
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model=MODEL, max_tokens=16, messages=user("Hi"), stop_sequences=["a", "b", "c", "d", "e"]
        )
    assert "stop_sequences" in err.value.api_message


def test_temperature_above_one_is_a_bad_request(client):
    # anthropic-python 2.x has no `temperature` argument any more; the spec's field still exists.
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=MODEL, max_tokens=16, messages=user("Hi"), extra_body={"temperature": 1.5})
    assert "temperature" in err.value.api_message


def test_an_invalid_key_is_an_authentication_error(api_url):
    with client_for(api_url, "sk-svc-not-a-real-key") as bad, pytest.raises(anthropic.AuthenticationError) as err:
        bad.messages.create(model=MODEL, max_tokens=16, messages=user("Hi"))
    assert err.value.type == "authentication_error"


def test_a_cli_key_on_v1_is_permission_denied(api_url, cli_key):
    with client_for(api_url, cli_key) as cli, pytest.raises(anthropic.PermissionDeniedError) as err:
        cli.messages.create(model=MODEL, max_tokens=16, messages=user("Hi"))
    assert err.value.type == "permission_error"


def test_retrieving_an_unknown_model_is_not_found(client):
    with pytest.raises(anthropic.NotFoundError) as err:
        client.models.retrieve("svc/unknown")
    assert err.value.type == "not_found_error"


def test_the_sixth_request_in_a_minute_on_a_free_key_is_rate_limited_with_retry_after(api_url, free_key):
    with client_for(api_url, free_key) as free:
        used = requests_used_in_a_fresh_window(
            lambda: free.messages.with_raw_response.create(model="svc/haiku", max_tokens=16, messages=user("Hi"))
        )
        for _ in range(5 - used):
            free.messages.create(model="svc/haiku", max_tokens=16, messages=user("Hi"))
        with pytest.raises(anthropic.RateLimitError) as err:
            free.messages.create(model="svc/haiku", max_tokens=16, messages=user("Hi"))

    assert err.value.type == "rate_limit_error"
    assert "requests per minute" in err.value.api_message
    assert 1 <= int(err.value.response.headers["retry-after"]) <= 60
    assert err.value.response.headers["x-ratelimit-tier"] == "free"
    assert err.value.response.headers["x-ratelimit-remaining-requests"] == "0"


def test_an_account_without_credits_gets_402_insufficient_quota(api_url, poor_key):
    with client_for(api_url, poor_key) as poor, pytest.raises(anthropic.APIStatusError) as err:
        poor.messages.create(model=MODEL, max_tokens=16, messages=user("Hi"))

    assert err.value.status_code == 402
    assert err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "insufficient_quota"
    payment_required = getattr(anthropic, "PaymentRequiredError", anthropic.APIStatusError)
    assert isinstance(err.value, payment_required)
