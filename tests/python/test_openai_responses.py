"""The official OpenAI Python SDK works unchanged against the gateway's /v1/responses surface:
`client.responses.create`, `client.responses.stream`, `retrieve`, `delete` and `input_items`,
through the simulated provider and through both upstream adapters (`mock_upstream.py`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from conftest import DEV_KEY
from mock_upstream import UPSTREAM_KEY, UPSTREAM_MODEL
from support import SIMULATED_PREFIX, TOOL_RESULT_TEXT, WEATHER_INPUT, WEATHER_SCHEMA, said

MODEL = "svc/sonnet"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather forecast for a city",
    "parameters": WEATHER_SCHEMA,
}
LEAKS = ("anthropic", "openai", UPSTREAM_MODEL, UPSTREAM_KEY)


def credits_of(usage) -> int:
    """`credits_consumed` is a service extension, so the SDK keeps it among the model's extras."""
    extras = usage.model_extra or {}
    assert "credits_consumed" in extras, f"usage without credits_consumed: {usage!r}"
    return extras["credits_consumed"]


def client_for(api_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=api_url + "/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def client(api_url: str, api_key: str) -> Iterator[openai.OpenAI]:
    with client_for(api_url, api_key) as c:
        yield c


def balance(api_url: str, key: str) -> int:
    account = httpx.get(f"{api_url}/v1/account", headers={"Authorization": f"Bearer {key}"}, trust_env=False)
    return account.json()["credits"]["balance"]


# --- plain text ----------------------------------------------------------------------------


def test_create_answers_plain_text_with_a_resp_id_usage_and_credits_equal_to_the_balance_drop(api_url, mint_key):
    key = mint_key(tier="high_volume")
    with client_for(api_url, key.key) as client:
        before = balance(api_url, key.key)
        response = client.responses.create(model=MODEL, input="Hello there", instructions="Be brief.")
        after = balance(api_url, key.key)

    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.status == "completed"
    assert response.model == MODEL
    assert response.output_text.startswith(SIMULATED_PREFIX)
    assert response.output_text.endswith(said("Hello there"))
    usage = response.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert before - after == credits_of(usage) > 0


def test_stream_delivers_text_deltas_in_sequence_and_a_final_response(client):
    with client.responses.stream(model=MODEL, input="stream me please") as stream:
        events = list(stream)
        final = stream.get_final_response()

    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.endswith(said("stream me please"))
    assert final.output_text == text
    assert final.status == "completed"
    assert credits_of(final.usage) > 0


def test_create_with_stream_true_yields_typed_events(client):
    stream = client.responses.create(model="svc/haiku", input="raw events", stream=True)
    types = [event.type for event in stream]
    assert "response.output_text.delta" in types
    assert types[-1] == "response.completed"


# --- multi-turn ----------------------------------------------------------------------------


def test_previous_response_id_continues_a_stored_conversation_and_retrieve_and_delete_work(client):
    first = client.responses.create(model=MODEL, input="My name is Ada.")
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input="What is my name?")
    assert second.previous_response_id == first.id
    assert second.output_text.endswith(said("What is my name?"))

    items = client.responses.input_items.list(second.id, order="asc")
    texts = [item.content[0].text for item in items.data if item.type == "message"]
    assert texts[0] == "My name is Ada."
    assert texts[-1] == "What is my name?"

    retrieved = client.responses.retrieve(first.id)
    assert retrieved.id == first.id and retrieved.output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_another_accounts_response_id_is_not_found(client, api_url, mint_key):
    mine = client.responses.create(model=MODEL, input="private")
    with client_for(api_url, mint_key().key) as other:
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(mine.id)
        with pytest.raises(openai.NotFoundError):
            other.responses.create(model=MODEL, previous_response_id=mine.id, input="hi")


def test_a_conversation_continues_by_resending_its_items(client):
    first = client.responses.create(model=MODEL, input="Remember the number 7.", store=False)
    history = [{"role": "user", "content": "Remember the number 7."}]
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"role": "user", "content": "Which number?"})
    second = client.responses.create(model=MODEL, input=history, store=False)
    assert second.output_text.endswith(said("Which number?"))
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


# --- tools, images, reasoning --------------------------------------------------------------


def test_a_function_call_round_trip_with_function_call_output(client):
    question = "What is the weather in Oslo?"
    first = client.responses.create(model=MODEL, input=question, tools=[WEATHER_TOOL], tool_choice="required")
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1
    call = calls[0]
    assert call.call_id.startswith("call_")
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == WEATHER_INPUT

    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        tools=[WEATHER_TOOL],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": TOOL_RESULT_TEXT}],
    )
    assert second.output_text.endswith(f"The tool returned: {TOOL_RESULT_TEXT}")


def test_a_streamed_function_call_arrives_as_argument_deltas(client):
    with client.responses.stream(
        model=MODEL, input="Weather?", tools=[WEATHER_TOOL], tool_choice="required"
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(deltas) == WEATHER_INPUT
    assert done[0].arguments == deltas
    call = [item for item in final.output if item.type == "function_call"][0]
    assert call.arguments == deltas


def test_an_image_input_is_accepted(client, png_base64):
    response = client.responses.create(
        model=MODEL,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Describe this."},
                    {"type": "input_image", "image_url": f"data:image/png;base64,{png_base64}"},
                ],
            }
        ],
    )
    assert response.output_text.endswith(said("Describe this."))


def test_reasoning_on_opus_streams_a_summary_and_its_sealed_item_continues_a_stateless_tool_loop(client):
    question = "Use get_weather: what is the weather in Oslo?"
    options = dict(
        model="svc/opus",
        reasoning={"effort": "low", "summary": "auto"},
        include=["reasoning.encrypted_content"],
        store=False,
        tools=[WEATHER_TOOL],
        max_output_tokens=4000,
    )
    with client.responses.stream(input=question, **options) as stream:
        events = list(stream)
        final = stream.get_final_response()
    summary = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    assert summary
    reasoning = final.output[0]
    assert reasoning.type == "reasoning"
    assert reasoning.summary[0].text == summary
    assert reasoning.encrypted_content
    assert final.usage.output_tokens_details.reasoning_tokens > 0
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    call = final.output[2]

    items = [{"role": "user", "content": question}]
    items += [item.model_dump(exclude_none=True) for item in final.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": TOOL_RESULT_TEXT})
    answer = client.responses.create(input=items, **options)
    assert answer.output_text.endswith(f"The tool returned: {TOOL_RESULT_TEXT}")

    items[1]["encrypted_content"] = "v1.forged.seal"
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(input=items, **options)
    assert "encrypted_content" in error.value.message


# --- errors --------------------------------------------------------------------------------


def test_errors_raise_the_sdk_exception_classes(client, api_url, poor_key, cli_key):
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="svc/unknown", input="hi")
    assert bad.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="hi", temperature=3)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_missing")
    with client_for(api_url, "sk-svc-not-a-key") as anonymous:
        with pytest.raises(openai.AuthenticationError):
            anonymous.responses.create(model=MODEL, input="hi")
    with client_for(api_url, cli_key) as cli:
        with pytest.raises(openai.PermissionDeniedError):
            cli.responses.create(model=MODEL, input="hi")
    with client_for(api_url, poor_key) as poor:
        with pytest.raises(openai.APIStatusError) as broke:
            poor.responses.create(model=MODEL, input="hi")
    assert broke.value.status_code == 402


# --- through the upstream adapters ---------------------------------------------------------


def test_a_streamed_tool_loop_runs_through_each_adapter(routed):
    adapter, url, mock = routed
    tool_input = {"city": "Oslo", "days": 2, "metric": True}
    mock.push([("tool", "get_weather", tool_input)], [("text", "Sunny in Oslo.")])
    with client_for(url, DEV_KEY) as client:
        with client.responses.stream(model=MODEL, input="Weather in Oslo?", tools=[WEATHER_TOOL]) as stream:
            for event in stream:
                payload = event.model_dump_json().lower()
                assert not any(word in payload for word in LEAKS), payload
            first = stream.get_final_response()
        call = [item for item in first.output if item.type == "function_call"][0]
        assert json.loads(call.arguments) == tool_input
        second = client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            tools=[WEATHER_TOOL],
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        )
    assert second.output_text == "Sunny in Oslo."
    assert second.model == MODEL
    sent = mock.last_body()
    # Bedrock, Gemini and Vertex name the model in their paths (test_upstream_adapters.py checks it).
    assert sent.get("model", UPSTREAM_MODEL) == UPSTREAM_MODEL
    if adapter in ("anthropic", "bedrock", "vertex"):
        assert sent["messages"][2]["content"][0]["tool_use_id"] == call.call_id
    elif adapter == "gemini":
        response = {"name": "get_weather", "response": {"content": "sunny"}}
        assert sent["contents"][-1]["parts"][0] == {"functionResponse": response}
    else:
        assert sent["messages"][-1] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}
