#!/usr/bin/env node
// Enqueue one batchd job and read its result through a consumer group, with ioredis.
//
//     REDIS_URL=redis://127.0.0.1:6379 BATCHD_NAMESPACE=batchd node enqueue_and_read.js [JOB_ID [PROVIDER]]
//
// PROVIDER picks the job: `cloudflare` (the default: Workers AI, @cf/...), `openai` (OpenAI Batch, openai/...) or
// `anthropic` (Anthropic Message Batches, anthropic/...). The daemon routes a job by its model name; the job, the
// result entry and the reading loop are the same for every provider, only the request items differ (each is the
// provider's own request body, without "model": docs/providers.md).
//
// Prints one JSON line, {"job_id": .., "status": .., "responses": N, "succeeded": N, ...}, and exits 0 when the job
// completed; exits 1 with a one-line error otherwise (or after 60 s without its result).
//
// The reading loop is the reliable pattern from docs/producers.md: a consumer group of the application's own, its
// own pending entries first after a restart (read from id 0), then entries a dead consumer left behind (XAUTOCLAIM),
// then new entries (id ">"), each acknowledged (XACK) only after it was handled. Delivery is at least once, so
// handling dedupes on job_id.
"use strict";

const Redis = require("ioredis");

const GROUP = "node-example"; // one consumer group per consuming application
const CONSUMER = "worker-1"; // stable across restarts, so a restart resumes its pending entries
const CLAIM_MIN_IDLE_MS = 60000; // entries another consumer held this long without XACK are taken over

// One sample job per provider: its model and two request items.
const JOBS = {
  cloudflare: {
    model: "@cf/baai/bge-m3",
    requests: [
      { query: "What is batchd?", contexts: [{ text: "A batch daemon." }, { text: "A fruit." }] },
      { text: "batchd runs Workers AI batch jobs fed through Redis" },
    ],
  },
  // Chat Completions bodies; a job may add endpoint: "/v1/embeddings" (or "/v1/responses", ...) instead.
  openai: {
    model: "openai/gpt-4o-mini",
    requests: [
      { messages: [{ role: "user", content: "What is batchd?" }], max_tokens: 50 },
      { messages: [{ role: "user", content: "Name one use of a batch API." }], max_tokens: 50 },
    ],
  },
  // Messages API bodies (max_tokens is required).
  anthropic: {
    model: "anthropic/claude-sonnet-4-5",
    requests: [
      { max_tokens: 50, messages: [{ role: "user", content: "What is batchd?" }] },
      { max_tokens: 50, messages: [{ role: "user", content: "Name one use of a batch API." }] },
    ],
  },
};

/** A field list [name, value, name, value, ...] as an object, or null for an entry trimmed while pending. */
function fieldsOf(list) {
  if (list === null) return null;
  const fields = {};
  for (let i = 0; i < list.length; i += 2) fields[list[i]] = list[i + 1];
  return fields;
}

/** XREADGROUP of one stream: [[entryId, fields or null], ...]. */
async function read(redis, stream, start, blockMs) {
  const args = ["GROUP", GROUP, CONSUMER, "COUNT", 100];
  if (blockMs !== null) args.push("BLOCK", blockMs);
  const reply = await redis.xreadgroup(...args, "STREAMS", stream, start);
  return reply ? reply[0][1].map(([id, list]) => [id, fieldsOf(list)]) : [];
}

/** The result entry in brief: `result` is JSON text with one response per request, in request order. */
function summary(fields, redelivered) {
  const result = fields.result ? JSON.parse(fields.result) : { responses: [] };
  return {
    job_id: fields.job_id,
    status: fields.status,
    responses: result.responses.length,
    succeeded: result.responses.filter((response) => response.success).length,
    in_order: result.responses.every((response, i) => response.index === i),
    metadata: fields.metadata ? JSON.parse(fields.metadata) : null,
    redelivered,
  };
}

async function main() {
  const url = process.env.REDIS_URL || "redis://127.0.0.1:6379";
  const namespace = process.env.BATCHD_NAMESPACE || "batchd";
  const jobId = process.argv[2] || `node-example-${process.pid}`;
  const provider = process.argv[3] || "cloudflare";
  if (!Object.hasOwn(JOBS, provider)) {
    throw new Error(`unknown provider "${provider}"; use one of ${Object.keys(JOBS).join(", ")}`);
  }
  const submit = `{${namespace}}:submit`;
  const results = `{${namespace}}:results`;
  const redis = new Redis(url, { maxRetriesPerRequest: 1, lazyConnect: true });
  redis.on("error", () => {}); // failures surface as rejected commands
  await redis.connect();
  try {
    // 1. The group, created once at the start of the stream (BUSYGROUP: it already exists).
    try {
      await redis.xgroup("CREATE", results, GROUP, "0", "MKSTREAM");
    } catch (error) {
      if (!String(error.message).includes("BUSYGROUP")) throw error;
    }

    // 2. Enqueue: one XADD, one field `job`. With an `id`, enqueueing again after a timeout is harmless.
    const job = { id: jobId, ...JOBS[provider], metadata: { example: "node", provider } };
    await redis.xadd(submit, "*", "job", JSON.stringify(job));
    console.error(`enqueued ${jobId}`);

    // 3. Read results until ours arrives.
    const handled = new Set(); // job ids already handled: a redelivered entry is not handled twice
    let backlog = true; // our own pending entries first
    const deadline = Date.now() + 60000;
    while (Date.now() < deadline) {
      let entries;
      let redelivered = true;
      if (backlog) {
        entries = await read(redis, results, "0", null);
        backlog = entries.length > 0;
      } else {
        const [, claimed] = await redis.xautoclaim(results, GROUP, CONSUMER, CLAIM_MIN_IDLE_MS, "0-0", "COUNT", 100);
        entries = claimed.map(([id, list]) => [id, fieldsOf(list)]);
        if (entries.length === 0) {
          entries = await read(redis, results, ">", 2000);
          redelivered = false;
        }
      }
      for (const [entryId, fields] of entries) {
        if (fields === null) {
          await redis.xack(results, GROUP, entryId); // trimmed while pending: nothing left to handle
          continue;
        }
        const mine = fields.job_id === jobId;
        let outcome = null;
        if (!handled.has(fields.job_id)) {
          handled.add(fields.job_id);
          if (mine) outcome = summary(fields, redelivered);
        }
        await redis.xack(results, GROUP, entryId); // after handling: a crash before this means a redelivery
        if (mine && outcome) {
          console.log(JSON.stringify(outcome));
          if (outcome.status !== "completed") throw new Error(`job ${jobId} ended ${outcome.status}`);
          return;
        }
      }
    }
    throw new Error(`no result for ${jobId} within 60 s; is the daemon running on namespace ${namespace}?`);
  } finally {
    redis.disconnect();
  }
}

main().catch((error) => {
  console.error(`enqueue_and_read: ${error.message}`);
  process.exit(1);
});
