// The seed pages' JavaScript examples, run with the official openai npm package against a Kiln
// gateway. tests/e2e starts the gateway and sets KILN_BASE_URL and KILN_API_KEY; only the base
// URL differs from the published examples.
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.KILN_BASE_URL,
  apiKey: process.env.KILN_API_KEY,
});

test("chat completions: the seed example", async () => {
  const resp = await client.chat.completions.create({
    model: "qwen3-32b",
    messages: [
      { role: "system", content: "Answer briefly." },
      { role: "user", content: "Hello!" },
    ],
    max_tokens: 800,
  });
  console.log(resp.choices[0].message.content.slice(0, 40));
  console.log(resp.usage);
  assert.equal(resp.object, "chat.completion");
  assert.equal(resp.model, "qwen3-32b");
  assert.equal(resp.choices[0].finish_reason, "length");
  assert.equal(resp.usage.completion_tokens, 800);
  assert.equal(resp.usage.total_tokens, resp.usage.prompt_tokens + 800);
  assert.equal(typeof resp.usage.cost, "number");
  assert.ok(resp.usage.cost > 0);
});

test("completions: the seed example", async () => {
  const resp = await client.completions.create({
    model: "qwen3-32b",
    prompt: "The capital of France is",
    max_tokens: 32,
  });
  console.log(resp.choices[0].text.slice(0, 40));
  console.log(resp.usage);
  assert.equal(resp.object, "text_completion");
  assert.equal(resp.usage.prompt_tokens, 5);
  assert.equal(resp.usage.completion_tokens, 32);
});

test("completions: the seed page's cost on gpt-oss-120b", async () => {
  const { data, response } = await client.completions
    .create({ model: "gpt-oss-120b", prompt: "The capital of France is", max_tokens: 7 })
    .withResponse();
  assert.equal(data.usage.cost, 0.000000665);
  assert.match(response.headers.get("x-neocloud-generation-id"), /^gen-[0-9A-Z]{26}$/);
});

test("chat completions: streaming, token by token, with the usage chunk", async () => {
  const stream = await client.chat.completions.create({
    model: "gpt-oss-120b",
    messages: [{ role: "user", content: "one two three four five six seven eight nine" }],
    max_tokens: 12,
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.choices.length === 0) usage = chunk.usage;
    else text += chunk.choices[0].delta.content ?? "";
  }
  assert.equal(text.split(" ").length, 12);
  assert.ok(chunks >= 14, `only ${chunks} chunks`);
  assert.deepEqual(
    { p: usage.prompt_tokens, c: usage.completion_tokens, t: usage.total_tokens, cost: usage.cost },
    { p: 9, c: 12, t: 21, cost: 0.000001155 },
  );
});

test("chat completions: streaming without include_usage has no usage chunk", async () => {
  const stream = await client.chat.completions.create({
    model: "qwen3-32b",
    messages: [{ role: "user", content: "Hello!" }],
    max_tokens: 3,
    stream: true,
  });
  for await (const chunk of stream) {
    assert.ok(chunk.choices.length > 0, "an unrequested usage chunk reached the client");
    assert.equal(chunk.usage ?? null, null);
  }
});

test("tool calls, streamed in fragments", async () => {
  const stream = await client.chat.completions.create({
    model: "gpt-oss-120b",
    messages: [{ role: "user", content: "Weather in Paris? [[sim:tool_call=get_weather]]" }],
    tools: [{ type: "function", function: { name: "get_weather", description: "Weather of a city", parameters: { type: "object" } } }],
    tool_choice: "auto",
    stream: true,
  });
  let args = "";
  let name = "";
  let finish = null;
  for await (const chunk of stream) {
    for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) {
      name += tc.function?.name ?? "";
      args += tc.function?.arguments ?? "";
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(name, "get_weather");
  assert.deepEqual(JSON.parse(args), { city: "Paris", unit: "celsius" });
  assert.equal(finish, "tool_calls");
});

test("errors carry status and code", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "not-a-model", messages: [{ role: "user", content: "hi" }] }),
    (err) => err.status === 404 && err.code === "model_not_found" && err.param === "model",
  );
  await assert.rejects(
    client.chat.completions.create({ model: "qwen3-32b", messages: [] }),
    (err) => err.status === 400 && err.code === "empty_array" &&
      err.message.includes("Invalid 'messages': the array must contain at least one message."),
  );
  await assert.rejects(
    client.chat.completions.create({ model: "qwen3-32b", messages: [{ role: "user", content: "hi" }], tool_choice: "required",
      tools: [{ type: "function", function: { name: "f", description: "d" } }] }),
    (err) => err.status === 400 && err.code === "unsupported_parameter" && err.param === "tool_choice",
  );
  const bad = new OpenAI({ baseURL: process.env.KILN_BASE_URL, apiKey: "kiln-not-a-real-key", maxRetries: 0 });
  await assert.rejects(bad.models.list(), (err) => err.status === 401 && err.code === "invalid_api_key");
});

test("an aborted stream ends the iteration at once", async () => {
  const controller = new AbortController();
  const stream = await client.chat.completions.create(
    { model: "qwen3-32b", messages: [{ role: "user", content: "slow [[sim:delay_ms=20]]" }], max_tokens: 500, stream: true },
    { signal: controller.signal },
  );
  let n = 0;
  const started = Date.now();
  try {
    for await (const chunk of stream) {
      if (++n === 5) controller.abort();
    }
  } catch (err) {
    assert.equal(err.name, "APIUserAbortError");
  }
  assert.equal(n, 5);
  assert.ok(Date.now() - started < 5000, "the stream went on after the abort");
});
