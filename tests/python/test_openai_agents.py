"""The OpenAI Agents SDK (`openai-agents`) runs an agent with a function tool through the
gateway unchanged: its default model speaks the Responses API, so the agent's loop (the model
calls `get_weather`, the SDK runs it and sends the output back as a `function_call_output`
item, the model answers) goes through `POST /v1/responses`, plain and streamed, through each
upstream adapter to the scripted mock upstream.
"""

from __future__ import annotations

import asyncio

import openai
from agents import (
    Agent,
    ItemHelpers,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from conftest import DEV_KEY
from mock_upstream import carries_tool_output

ANSWER = "Sunny in Oslo today."
TOOL_OUTPUT = "sunny, 21 degrees"

# The SDK exports traces to OpenAI by default; these tests run offline.
set_tracing_disabled(True)

calls: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city now."""
    calls.append(city)
    return TOOL_OUTPUT


def weather_agent(url: str) -> Agent:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=DEV_KEY, max_retries=0, timeout=30)
    return Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model="svc/sonnet", openai_client=client),
    )


def test_an_agent_calls_its_function_tool_and_answers_through_each_adapter(routed):
    _, url, mock = routed
    mock.push([("tool", "get_weather", {"city": "Oslo"})], [("text", ANSWER)])
    calls.clear()
    result = Runner.run_sync(weather_agent(url), "What is the weather in Oslo?")
    assert result.final_output == ANSWER
    assert calls == ["Oslo"]
    assert carries_tool_output(mock.last_body(), TOOL_OUTPUT)
    usage = result.context_wrapper.usage
    assert usage.requests == 2 and usage.input_tokens > 0 and usage.output_tokens > 0


def test_a_streamed_agent_run_delivers_the_tool_call_its_output_and_the_answer(routed):
    _, url, mock = routed
    mock.push([("tool", "get_weather", {"city": "Oslo"})], [("text", ANSWER)])
    calls.clear()

    async def run() -> tuple[list[str], str]:
        streamed = Runner.run_streamed(weather_agent(url), "What is the weather in Oslo?")
        items = []
        async for event in streamed.stream_events():
            if event.type == "run_item_stream_event":
                items.append(event.item.type)
                if event.item.type == "message_output_item":
                    assert ItemHelpers.text_message_output(event.item) == ANSWER
        return items, streamed.final_output

    items, final = asyncio.run(run())
    assert final == ANSWER
    assert calls == ["Oslo"]
    assert items == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert carries_tool_output(mock.last_body(), TOOL_OUTPUT)
