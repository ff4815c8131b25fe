// The official OpenAI Node SDK, unchanged but for its base URL, in a tool-calling agent loop
// whose tool runs through oncegate's effects API (docs/effects.md). The loop is run twice as a
// whole, as a caller retrying it after a crash would: the second run gets the first's answers
// (the same tool call id, through the auto key oncegate echoes) and the tool's recorded result,
// and the tool body (a POST to ONCEGATE_SINK, the "downstream system") runs once. Run by
// e2e/node_sdk_test.go; prints one JSON object with what each run saw.
import { createHash } from 'node:crypto';
import OpenAI from 'openai';

const base = process.env.ONCEGATE_BASE;
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'sk-unused', maxRetries: 2 });
const model = process.env.ONCEGATE_MODEL;
const tag = process.env.ONCEGATE_TAG; // makes every run's inputs new intents
const tools = [{ type: 'function', function: { name: 'send_report', parameters: { type: 'object' } } }];

// canonical is JSON with object keys sorted at every depth: the arguments' fingerprint.
const canonical = (v) =>
  Array.isArray(v) ? `[${v.map(canonical).join(',')}]`
    : v && typeof v === 'object' ? `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(',')}}`
      : JSON.stringify(v);

// once runs fn(effectKey) once for the effect `name` of the intent `key`, and returns its
// recorded result: claim, run, complete; a repeat gets the recorded result; a copy running
// it at the moment is waited for (Retry-After).
async function once(key, name, args, fn) {
  const url = `${base}/v1/idempotency/${encodeURIComponent(key)}/effects/${encodeURIComponent(name)}`;
  const fingerprint = createHash('sha256').update(canonical(args)).digest('hex');
  const headers = { 'content-type': 'application/json' };
  for (;;) {
    const claim = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ fingerprint }) });
    const v = await claim.json();
    if (claim.status === 201) {
      const result = await fn(v.effect_key);
      const done = await fetch(url, { method: 'PUT', headers, body: JSON.stringify({ fence: v.fence, result }) });
      if (done.status !== 200) throw new Error(`complete: ${done.status} ${await done.text()}`);
      return (await done.json()).result;
    }
    if (claim.status === 200) return v.result;
    if (claim.status === 409 && v.state === 'in_progress') {
      await new Promise((r) => setTimeout(r, 1000 * Number(claim.headers.get('retry-after') ?? 1)));
      continue;
    }
    throw new Error(`claim: ${claim.status} ${JSON.stringify(v)}`);
  }
}

// agentLoop is the caller's whole loop: ask, run the tool call, answer with its result.
async function agentLoop(run) {
  const messages = [{ role: 'user', content: `node effects ${tag}` }];
  const { data: first, response } = await client.chat.completions.create({ model, messages, tools }).withResponse();
  const key = response.headers.get('idempotency-key'); // the auto key: the same for the same request
  const call = first.choices[0].message.tool_calls[0];
  const result = await once(key, call.id, JSON.parse(call.function.arguments), async (effectKey) => {
    await fetch(process.env.ONCEGATE_SINK, { method: 'POST', headers: { 'Idempotency-Key': effectKey }, body: JSON.stringify({ run }) });
    return { sent: true, run };
  });
  messages.push(first.choices[0].message, { role: 'tool', tool_call_id: call.id, content: JSON.stringify(result) });
  const second = await client.chat.completions.create({ model, messages, tools });
  return { key, callId: call.id, result, final: second.choices[0].message.content };
}

const out = { first: await agentLoop(1), second: await agentLoop(2) };
console.log(JSON.stringify(out));
