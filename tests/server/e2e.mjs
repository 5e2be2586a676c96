// End-to-end checks of a running `tessera serve` with the official OpenAI
// client (npm `openai`) and plain fetch. Started by e2e.sh, which passes:
//   BASE_URL      http://127.0.0.1:PORT
//   PROMPT        a completion prompt
//   REF_GREEDY    `tessera run -p PROMPT -n 20` output (greedy)
//   REF_SEEDED    `tessera run -p PROMPT -n 20 --temp 0.8 --seed 42` output
//   CHAT_MSG      a user message; REF_CHAT: `tessera run --chat CHAT_MSG
//                 --chat-format chatml -n 20` output
//   ABORTS        number of streaming requests to abort at random points
import OpenAI from "openai";

const base = process.env.BASE_URL;
const client = new OpenAI({ baseURL: base + "/v1", apiKey: "none", maxRetries: 0 });
const PROMPT = process.env.PROMPT;
let failures = 0;

function check(cond, what, detail) {
  if (cond) {
    console.log(`ok    ${what}`);
  } else {
    failures++;
    console.log(`FAIL  ${what}${detail !== undefined ? ": " + JSON.stringify(detail) : ""}`);
  }
}

async function metrics() {
  const text = await (await fetch(base + "/metrics")).text();
  const m = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const i = line.lastIndexOf(" ");
    m[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return m;
}

function sum(m, prefix) {
  let s = 0;
  for (const k of Object.keys(m)) if (k.startsWith(prefix)) s += m[k];
  return s;
}

// Deterministic pseudo-random numbers (printed seed).
let rng = 20261129;
function rand() {
  rng = (rng * 1103515245 + 12345) % 2147483648;
  return rng / 2147483648;
}

async function completionsAndChat() {
  // Greedy completion equals `tessera run`, streamed or not.
  const c = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 20, temperature: 0 });
  check(c.choices[0].text === process.env.REF_GREEDY, "greedy completion equals tessera run", [c.choices[0].text, process.env.REF_GREEDY]);
  check(c.choices[0].finish_reason === "length", "finish_reason length", c.choices[0].finish_reason);
  check(c.usage.completion_tokens === 20 && c.usage.total_tokens === c.usage.prompt_tokens + 20, "usage counts", c.usage);

  const s = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 20, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const ch of s) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    if (ch.choices.length) {
      text += ch.choices[0].text;
      if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
    }
  }
  check(text === process.env.REF_GREEDY, "streamed greedy completion equals tessera run", [text, process.env.REF_GREEDY]);
  check(finish === "length" && usage && usage.completion_tokens === 20 && chunks > 2, "stream finish, usage chunk", { finish, usage, chunks });

  // Seeds reproduce sampled output (and match tessera run with the same seed).
  const a = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 20, temperature: 0.8, seed: 42 });
  const b = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 20, temperature: 0.8, seed: 42 });
  check(a.choices[0].text === b.choices[0].text, "same seed, same text", [a.choices[0].text, b.choices[0].text]);
  check(a.choices[0].text === process.env.REF_SEEDED, "seeded text equals tessera run --seed 42", [a.choices[0].text, process.env.REF_SEEDED]);
  const others = new Set();
  for (const seed of [1, 2, 3, 4]) {
    const r = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 20, temperature: 0.8, seed });
    others.add(r.choices[0].text);
  }
  check(others.size > 1, "different seeds give different texts", [...others]);

  // Stop strings: cut before the first match, also when it spans tokens.
  const full = process.env.REF_GREEDY;
  const words = full.split(" ").filter((w) => w.length > 3);
  const stops = [words[1], full.slice(8, 13)]; // a word; a span across tokens
  for (const stop of stops) {
    const want = full.slice(0, full.indexOf(stop));
    const r = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 20, temperature: 0, stop });
    check(r.choices[0].text === want && r.choices[0].finish_reason === "stop", `stop ${JSON.stringify(stop)} (not streamed)`, [r.choices[0].text, want, r.choices[0].finish_reason]);
    const st = await client.completions.create({ model: "m", prompt: PROMPT, max_tokens: 20, temperature: 0, stop: [stop], stream: true });
    let t = "", f = null;
    for await (const ch of st) {
      if (!ch.choices.length) continue;
      t += ch.choices[0].text;
      if (ch.choices[0].finish_reason) f = ch.choices[0].finish_reason;
    }
    check(t === want && f === "stop", `stop ${JSON.stringify(stop)} (streamed)`, [t, want, f]);
  }

  // Chat (chat format chatml; see e2e.sh), streamed and not.
  const msg = process.env.CHAT_MSG;
  const cc = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: msg }], max_tokens: 20, temperature: 0 });
  check(cc.choices[0].message.content === process.env.REF_CHAT, "greedy chat equals tessera run --chat", [cc.choices[0].message.content, process.env.REF_CHAT]);
  check(cc.choices[0].message.role === "assistant" && cc.object === "chat.completion", "chat response shape", cc);
  const parts = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: [{ type: "text", text: msg.slice(0, 3) }, { type: "text", text: msg.slice(3) }] }], max_tokens: 20, temperature: 0 });
  check(parts.choices[0].message.content === process.env.REF_CHAT, "content as text parts equals the string", parts.choices[0].message.content);
  const cs = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: msg }], max_tokens: 20, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let ct = "", role = null, cu = null;
  for await (const ch of cs) {
    if (ch.usage) cu = ch.usage;
    if (!ch.choices.length) continue;
    if (ch.choices[0].delta.role) role = ch.choices[0].delta.role;
    ct += ch.choices[0].delta.content ?? "";
  }
  check(ct === process.env.REF_CHAT && role === "assistant" && cu && cu.completion_tokens === 20, "streamed chat equals tessera run --chat", [ct, role, cu]);

  // Log-probabilities: one entry per token, top alternatives sorted.
  const lp = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: msg }], max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 3 });
  const entries = lp.choices[0].logprobs.content;
  check(entries.length === 5 && entries.every((e) => e.top_logprobs.length === 3 && e.logprob <= 0 && e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob && e.top_logprobs[0].token === e.token),
        "greedy logprobs: 5 entries, top-3 sorted, chosen = best", entries);
  check(entries.map((e) => e.token).join("") === lp.choices[0].message.content, "logprob tokens spell the content", entries.map((e) => e.token));

  // Errors arrive as OpenAI errors (the client raises BadRequestError).
  for (const [what, req, param] of [
    ["n=2", { n: 2 }, "n"],
    ["top_logprobs 21", { logprobs: true, top_logprobs: 21 }, "top_logprobs"],
    ["temperature -1", { temperature: -1 }, "temperature"],
    ["empty stop", { stop: [""] }, "stop"],
    ["max_tokens beyond the context", { max_tokens: 100000 }, "max_tokens"],
  ]) {
    try {
      await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: msg }], ...req });
      check(false, `400 for ${what}`, "accepted");
    } catch (e) {
      check(e.status === 400 && e.param === param && e.type === "invalid_request_error", `400 for ${what}`, { status: e.status, param: e.param, msg: e.message });
    }
  }
  try {
    await client.chat.completions.create({ model: "m", messages: [{ role: "wizard", content: "x" }] });
    check(false, "400 for an unknown role", "accepted");
  } catch (e) {
    check(e.status === 400 && e.param === "messages[0].role", "400 for an unknown role", { status: e.status, param: e.param });
  }
  const models = await client.models.list();
  check(models.data.length === 1 && typeof models.data[0].id === "string", "GET /v1/models", models.data);
}

// Client aborts at random points across many streaming requests.
async function aborts(n) {
  const before = await metrics();
  const idleKv = before["tessera_kv_cache_used_bytes"];
  const conc = 12;
  let next = 0, aborted = 0, completed = 0, early = 0, maxKv = 0, polls = 0;
  console.log(`abort test: ${n} streams, concurrency ${conc}, rng seed 20261129`);
  async function one() {
    const ac = new AbortController();
    const mode = rand();
    const limitChunks = Math.floor(rand() * 30);
    let timer = null;
    // 20%: abort on a timer, often while queued (before the response headers)
    if (mode < 0.2) timer = setTimeout(() => ac.abort(), 5 + Math.floor(rand() * 40));
    let headers = false;
    try {
      const res = await fetch(base + "/v1/completions", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: PROMPT, max_tokens: 30, temperature: 0.7, seed: 7, stream: true }),
        signal: ac.signal,
      });
      headers = true;
      const reader = res.body.getReader();
      let chunks = 0;
      for (;;) {
        const { done } = await reader.read();
        if (done) break;
        if (mode >= 0.2 && mode < 0.8 && ++chunks >= limitChunks) {
          ac.abort();
          break;
        }
      }
      if (ac.signal.aborted) aborted++;
      else completed++;
    } catch (e) {
      aborted++;
      if (!headers) early++;
    } finally {
      if (timer) clearTimeout(timer);
    }
  }
  async function worker() {
    while (next < n) {
      next++;
      await one();
      if (++polls % 10 === 0) maxKv = Math.max(maxKv, (await metrics())["tessera_kv_cache_used_bytes"]);
    }
  }
  await Promise.all(Array.from({ length: conc }, worker));
  console.log(`abort test: ${aborted} aborted (${early} before the response headers), ${completed} read to the end; max KV seen ${maxKv}`);
  // Every request accounted for, KV back to idle.
  let after;
  for (let i = 0; i < 100; i++) {
    after = await metrics();
    const fin = sum(after, "tessera_requests_finished_total") - sum(before, "tessera_requests_finished_total");
    // a connection is counted in tessera_requests_total when the HTTP library
    // reports it closed, which may come a moment after its generation ended
    const reqs = sum(after, "tessera_requests_total") - sum(before, "tessera_requests_total");
    if (fin >= n - early && reqs === fin && after["tessera_kv_cache_used_bytes"] === idleKv &&
        after["tessera_requests_running"] === 0) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  const reqs = sum(after, "tessera_requests_total") - sum(before, "tessera_requests_total");
  const fin = sum(after, "tessera_requests_finished_total") - sum(before, "tessera_requests_finished_total");
  const cancelled = after['tessera_requests_finished_total{reason="cancelled"}'] - before['tessera_requests_finished_total{reason="cancelled"}'];
  // A request aborted before its response headers may not have reached the
  // server at all; every other one must be counted, once, in both.
  check(reqs >= n - early && reqs <= n, `requests counted in tessera_requests_total: ${reqs} of ${n} (${early} aborted before headers)`);
  check(fin === reqs, `each counted request ended once in tessera_requests_finished_total (${fin} == ${reqs})`);
  check(maxKv > 0, `KV use seen while streams ran (${maxKv} bytes)`);
  check(cancelled >= 1 && cancelled <= aborted, `cancelled generations (${cancelled}) <= aborted clients (${aborted})`);
  check(after["tessera_kv_cache_used_bytes"] === idleKv, `KV back to idle (${after["tessera_kv_cache_used_bytes"]} == ${idleKv})`);
  check(after["tessera_requests_running"] === 0 && after["tessera_queue_depth"] === 0, "nothing running or queued");
  const h = await fetch(base + "/health");
  check(h.status === 200, "healthy after the aborts");
}

try {
  await completionsAndChat();
  await aborts(Number(process.env.ABORTS || 200));
} catch (e) {
  failures++;
  console.log("FAIL  exception: " + (e.stack || e));
}
console.log(failures ? `${failures} check(s) failed` : "all node checks passed");
process.exit(failures ? 1 : 0);
