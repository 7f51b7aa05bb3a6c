// One agent turn through the Vercel AI SDK (npm `ai` with `@ai-sdk/openai` and
// `@ai-sdk/anthropic`, the versions scripts/test pins), as an application would write it:
// a `get_weather` tool the model may call, a loop of at most three steps, the answer printed.
// Run by tests/tests/upstream_ai_sdk.rs, once per interface and mode:
//   node ai_sdk_agent.cjs BASE_URL (responses|chat|messages) (generate|stream)
// with the API key in SVC_API_KEY; prints one JSON line: the text, the tool calls and their
// results, the finish reason, the usage, and any error the SDK reported.
const { generateText, streamText, tool, stepCountIs } = require('ai');
const { createOpenAI } = require('@ai-sdk/openai');
const { createAnthropic } = require('@ai-sdk/anthropic');
const { z } = require('zod');

const [base, api, mode] = process.argv.slice(2);
const apiKey = process.env.SVC_API_KEY;
const model = {
  responses: () => createOpenAI({ baseURL: `${base}/v1`, apiKey })('svc/sonnet'),
  chat: () => createOpenAI({ baseURL: `${base}/v1`, apiKey }).chat('svc/sonnet'),
  messages: () => createAnthropic({ baseURL: `${base}/v1`, apiKey })('svc/sonnet'),
}[api]();

const executed = [];
const tools = {
  get_weather: tool({
    description: 'The weather in a city now.',
    inputSchema: z.object({ city: z.string() }),
    execute: async ({ city }) => {
      executed.push(city);
      return `Sunny and 21 degrees in ${city}`;
    },
  }),
};
const request = {
  model,
  tools,
  stopWhen: stepCountIs(3),
  maxOutputTokens: 1024,
  prompt: 'What is the weather in Paris?',
};

async function main() {
  const errors = [];
  let result;
  if (mode === 'stream') {
    const stream = streamText({ ...request, onError: ({ error }) => errors.push(String(error)) });
    let text = '';
    for await (const delta of stream.textStream) text += delta;
    result = {
      text,
      finishReason: await stream.finishReason,
      usage: await stream.totalUsage,
      steps: (await stream.steps).length,
    };
  } else {
    const r = await generateText(request);
    result = { text: r.text, finishReason: r.finishReason, usage: r.totalUsage, steps: r.steps.length };
  }
  console.log(JSON.stringify({ ...result, executed, errors }));
}

main().catch((e) => {
  console.log(JSON.stringify({ failed: String(e), body: e.responseBody, executed }));
  process.exitCode = 1;
});
