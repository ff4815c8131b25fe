// The official OpenAI Node SDK, unchanged but for its base URL, driving oncegate's Responses
// API. Run by e2e/node_sdk_test.go with ONCEGATE_BASE set; prints one JSON object with what
// each scenario saw, which the Go test checks against the mock and its execution count.
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.ONCEGATE_BASE + '/v1', apiKey: 'sk-unused', maxRetries: 2 });
const model = process.env.ONCEGATE_MODEL;
const tag = process.env.ONCEGATE_TAG; // makes every run's inputs new intents
const out = {};

const created = await client.responses.create({ model, input: `node create ${tag}` });
out.create = { id: created.id, status: created.status, text: created.output_text };

const stream = await client.responses.create({ model, input: `node stream ${tag}`, stream: true });
const types = [];
let streamed = '';
let seqOK = true;
for await (const ev of stream) {
  if (ev.sequence_number !== types.length) seqOK = false;
  types.push(ev.type);
  if (ev.type === 'response.output_text.delta') streamed += ev.delta;
}
out.stream = { types, text: streamed, seqOK };

const bg = await client.responses.create({ model, input: `node background ${tag}`, background: true });
let polled = bg;
for (let i = 0; i < 200 && (polled.status === 'queued' || polled.status === 'in_progress'); i++) {
  await new Promise((r) => setTimeout(r, 25));
  polled = await client.responses.retrieve(bg.id);
}
out.background = { first: bg.status, last: polled.status, text: polled.output_text, id: bg.id };

// A slow background response: its stream is cut after a few events and resumed.
const slow = await client.responses.create({ model, input: `node resume ${tag}`, background: true, mock: { inter_token_ms: 40 } });
const first = await client.responses.retrieve(slow.id, { stream: true });
const seqs = [];
const cutAt = 6;
for await (const ev of first) {
  seqs.push(ev.sequence_number);
  if (ev.sequence_number === cutAt) break; // the SDK aborts the request
}
const rest = await client.responses.retrieve(slow.id, { stream: true, starting_after: cutAt });
let resumedText = '';
for await (const ev of rest) {
  seqs.push(ev.sequence_number);
  if (ev.type === 'response.completed') resumedText = ev.response.output.flatMap((o) => o.content ?? []).map((c) => c.text).join('');
}
// The SDK's helper, which rebuilds the whole response, resumed after the cut too.
const helper = client.responses.stream({ response_id: slow.id, starting_after: cutAt });
const helperSeqs = [];
helper.on('event', (ev) => helperSeqs.push(ev.sequence_number));
const helperFinal = await helper.finalResponse();
out.resume = { seqs, text: resumedText, helperSeqs, helperText: helperFinal.output_text, helperStatus: helperFinal.status };

const toCancel = await client.responses.create({ model, input: `node cancel ${tag}`, background: true, mock: { inter_token_ms: 300 } });
const cancelled = await client.responses.cancel(toCancel.id);
out.cancel = { status: cancelled.status, retrieved: (await client.responses.retrieve(toCancel.id)).status };

const next = await client.responses.create({ model, input: `node turn two ${tag}`, previous_response_id: created.id });
out.previous = { text: next.output_text, previous: next.previous_response_id };

try {
  await client.responses.create({ model, input: 'x', tools: [{ type: 'web_search' }] });
  out.badRequest = { error: 'none' };
} catch (e) {
  out.badRequest = { error: e.constructor.name, status: e.status, code: e.code, param: e.param };
}

// Embeddings: the same batch twice is one backend call, the same vectors.
const emb1 = await client.embeddings.create({ model, input: [`node embed ${tag}`, 'second'] });
const emb2 = await client.embeddings.create({ model, input: [`node embed ${tag}`, 'second'] });
out.embeddings = { count: emb1.data.length, same: JSON.stringify(emb1.data) === JSON.stringify(emb2.data), dims: emb1.data[0].embedding.length, prompt: emb1.usage.prompt_tokens };

console.log(JSON.stringify(out));
