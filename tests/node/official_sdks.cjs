// A tool round trip through the gateway with the official Node SDKs (npm `openai` and
// `@anthropic-ai/sdk`, the versions scripts/test pins), as an application writes it: the model
// calls `get_weather`, the application answers with the tool's output, the model answers.
// Run by tests/tests/upstream_node_sdks.rs:
//   node official_sdks.cjs BASE_URL (messages|chat|responses)
// with the API key in SVC_API_KEY; prints one JSON line: what each step saw.
const OpenAI = require('openai');
const Anthropic = require('@anthropic-ai/sdk');

const [base, api] = process.argv.slice(2);
const apiKey = process.env.SVC_API_KEY;
const TOOL_OUTPUT = 'Sunny and 21 degrees in Paris';
const question = 'What is the weather in Paris?';
const parameters = {
  type: 'object',
  properties: { city: { type: 'string' } },
  required: ['city'],
};

async function messages() {
  const client = new Anthropic({ baseURL: base, apiKey, maxRetries: 0 });
  const tools = [{ name: 'get_weather', description: 'The weather in a city now.', input_schema: parameters }];
  const history = [{ role: 'user', content: question }];
  const first = await client.messages.create({ model: 'svc/sonnet', max_tokens: 1024, tools, messages: history });
  const call = first.content.find((b) => b.type === 'tool_use');
  history.push({ role: 'assistant', content: first.content });
  history.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: TOOL_OUTPUT }] });
  const stream = client.messages.stream({ model: 'svc/sonnet', max_tokens: 1024, tools, messages: history });
  let text = '';
  stream.on('text', (delta) => { text += delta; });
  const second = await stream.finalMessage();
  const refused = await new Anthropic({ baseURL: base, apiKey: 'sk-svc-wrong', maxRetries: 0 })
    .messages.create({ model: 'svc/sonnet', max_tokens: 16, messages: history })
    .then(() => 'accepted', (e) => e.constructor.name);
  return {
    model: [first.model, second.model],
    stop: [first.stop_reason, second.stop_reason],
    call: call && { name: call.name, input: call.input },
    text,
    final: second.content.filter((b) => b.type === 'text').map((b) => b.text).join(''),
    usage: second.usage,
    refused,
  };
}

async function chat() {
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0 });
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters } }];
  const history = [{ role: 'user', content: question }];
  const first = await client.chat.completions.create({ model: 'svc/sonnet', tools, messages: history });
  const message = first.choices[0].message;
  const call = message.tool_calls?.[0];
  history.push(message);
  history.push({ role: 'tool', tool_call_id: call.id, content: TOOL_OUTPUT });
  const stream = client.chat.completions.stream({
    model: 'svc/sonnet', tools, messages: history, stream_options: { include_usage: true },
  });
  let text = '';
  stream.on('content', (delta) => { text += delta; });
  const second = await stream.finalChatCompletion();
  const refused = await new OpenAI({ baseURL: `${base}/v1`, apiKey: 'sk-svc-wrong', maxRetries: 0 })
    .chat.completions.create({ model: 'svc/sonnet', messages: history })
    .then(() => 'accepted', (e) => e.constructor.name);
  return {
    model: [first.model, second.model],
    stop: [first.choices[0].finish_reason, second.choices[0].finish_reason],
    call: call && { name: call.function.name, input: JSON.parse(call.function.arguments) },
    text,
    final: second.choices[0].message.content,
    usage: second.usage,
    refused,
  };
}

async function responses() {
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0 });
  const tools = [{ type: 'function', name: 'get_weather', parameters, strict: false }];
  const first = await client.responses.create({ model: 'svc/sonnet', tools, input: question });
  const call = first.output.find((item) => item.type === 'function_call');
  const stream = client.responses.stream({
    model: 'svc/sonnet',
    tools,
    previous_response_id: first.id,
    input: [{ type: 'function_call_output', call_id: call.call_id, output: TOOL_OUTPUT }],
  });
  let text = '';
  stream.on('response.output_text.delta', (event) => { text += event.delta; });
  const second = await stream.finalResponse();
  const refused = await new OpenAI({ baseURL: `${base}/v1`, apiKey: 'sk-svc-wrong', maxRetries: 0 })
    .responses.create({ model: 'svc/sonnet', input: question })
    .then(() => 'accepted', (e) => e.constructor.name);
  return {
    model: [first.model, second.model],
    stop: [first.status, second.status],
    call: call && { name: call.name, input: JSON.parse(call.arguments) },
    text,
    // `output_text` is the SDK's own addition, which its stream helper leaves out.
    final: second.output
      .filter((item) => item.type === 'message')
      .flatMap((item) => item.content.filter((c) => c.type === 'output_text').map((c) => c.text))
      .join(''),
    usage: second.usage,
    refused,
  };
}

({ messages, chat, responses })[api]()
  .then((report) => console.log(JSON.stringify(report)))
  .catch((e) => {
    console.log(JSON.stringify({ failed: String(e), status: e.status, error: e.error }));
    process.exitCode = 1;
  });
