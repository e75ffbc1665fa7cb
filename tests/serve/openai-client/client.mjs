// Drives a strata HTTP API with the official `openai` npm client (run by
// tests/serve/test_openai_client.py, which checks what this prints).
// Environment: STRATA_BASE_URL (…/v1), STRATA_API_KEY, STRATA_MODEL.
// Prints one JSON object: what each call returned, or its error status.
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.STRATA_BASE_URL,
  apiKey: process.env.STRATA_API_KEY,
  maxRetries: 0,
  timeout: 60000,
});
const model = process.env.STRATA_MODEL;
const out = {};

async function status(fn) {
  try {
    await fn();
    return 200;
  } catch (e) {
    return e instanceof OpenAI.APIError ? { status: e.status, message: e.message } : String(e);
  }
}

async function main() {
  const list = await client.models.list();
  out.models = list.data.map((m) => m.id);
  out.model = await client.models.retrieve(model);
  out.missing_model = await status(() => client.models.retrieve("no-such-model"));

  const cbody = { model, prompt: "In the beginning God", max_tokens: 16, temperature: 0 };
  const c = await client.completions.create(cbody);
  out.completion = { text: c.choices[0].text, finish: c.choices[0].finish_reason, usage: c.usage };
  let text = "", usage = null, n = 0;
  for await (const ch of await client.completions.create({ ...cbody, stream: true })) {
    n++;
    if (ch.choices.length) text += ch.choices[0].text;
    if (ch.usage) usage = ch.usage;
  }
  out.completion_stream = { text, chunks: n, usage };

  const messages = [
    { role: "system", content: "Answer as the scripture does." },
    { role: "user", content: "Who created the heaven and the earth?" },
  ];
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
  out.chat = {
    role: chat.choices[0].message.role,
    text: chat.choices[0].message.content,
    finish: chat.choices[0].finish_reason,
    usage: chat.usage,
  };
  text = "";
  usage = null;
  let usage_chunks = 0, roles = 0;
  const st = await client.chat.completions.create({
    model, messages, max_tokens: 24, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  for await (const ch of st) {
    if (ch.usage) {
      usage = ch.usage;
      usage_chunks++;
      out.usage_chunk_choices = ch.choices.length;
    }
    if (ch.choices.length && ch.choices[0].delta.role) roles++;
    if (ch.choices.length && ch.choices[0].delta.content) text += ch.choices[0].delta.content;
  }
  out.chat_stream = { text, usage, usage_chunks, roles };

  out.tools = await status(() => client.chat.completions.create({
    model, messages, max_tokens: 4,
    tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: {} } } }],
  }));
  out.n2 = await status(() => client.completions.create({ ...cbody, n: 2 }));
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.log(JSON.stringify({ fatal: String(e), status: e.status }));
  process.exit(1);
});
