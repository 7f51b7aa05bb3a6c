"""LangChain's chat models (`langchain-openai`'s ChatOpenAI on chat completions and on the
Responses API, `langchain-anthropic`'s ChatAnthropic) run a tool-calling conversation through
the gateway unchanged, invoked and streamed, through each upstream adapter: the model calls the
bound `get_weather` tool, the application runs it and sends a ToolMessage back, the model
answers.
"""

from __future__ import annotations

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from conftest import DEV_KEY
from mock_upstream import carries_tool_output

ANSWER = "Sunny in Oslo today."
TOOL_OUTPUT = "sunny, 21 degrees"


@tool
def get_weather(city: str) -> str:
    """The weather in a city now."""
    return TOOL_OUTPUT


def chat_model(interface: str, url: str):
    if interface == "anthropic":
        return ChatAnthropic(
            model="svc/sonnet", base_url=url, api_key=DEV_KEY, max_tokens=1024, max_retries=0, timeout=30
        )
    return ChatOpenAI(
        model="svc/sonnet",
        base_url=f"{url}/v1",
        api_key=DEV_KEY,
        max_retries=0,
        timeout=30,
        use_responses_api=interface == "openai-responses",
        # Chat completions streams report usage only when asked (`stream_options`), as OpenAI's
        # do; LangChain asks by itself only for OpenAI's own base URL.
        stream_usage=True,
    )


def reply(model, messages: list, streamed: bool) -> AIMessage:
    if not streamed:
        return model.invoke(messages)
    chunks = iter(model.stream(messages))
    message = next(chunks)
    for chunk in chunks:
        message += chunk
    return message


@pytest.mark.parametrize("streamed", [False, True], ids=["invoke", "stream"])
@pytest.mark.parametrize("interface", ["openai-chat", "openai-responses", "anthropic"])
def test_a_langchain_chat_model_calls_a_bound_tool_and_answers_through_each_adapter(routed, interface, streamed):
    _, url, mock = routed
    mock.push([("tool", "get_weather", {"city": "Oslo"})], [("text", ANSWER)])
    model = chat_model(interface, url).bind_tools([get_weather])
    messages = [HumanMessage("What is the weather in Oslo?")]

    first = reply(model, messages, streamed)
    assert [(c["name"], c["args"]) for c in first.tool_calls] == [("get_weather", {"city": "Oslo"})]
    call = first.tool_calls[0]
    messages += [first, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]

    second = reply(model, messages, streamed)
    assert second.text == ANSWER
    assert second.tool_calls == []
    assert carries_tool_output(mock.last_body(), TOOL_OUTPUT)
    usage = second.usage_metadata
    assert usage is not None and usage["input_tokens"] > 0 and usage["output_tokens"] > 0
