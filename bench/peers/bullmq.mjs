// BullMQ side of the batchd queue-layer benchmark (scenario 1 of docs/benchmarks.md).
//
// Enqueues N no-op jobs (Queue.addBulk, 1,000 per call, one call at a time, removeOnComplete), then drains them
// with one Worker of the given concurrency, and prints one JSON line: the time of each phase, the Redis
// commands each phase cost (INFO commandstats before and after, on a separate connection; the INFO calls
// themselves are left out), redis-server's CPU time per phase (INFO cpu) and this process's CPU time while draining.
//
// usage: node bullmq.mjs --redis redis://127.0.0.1:6379 --n 20000 --concurrency 50 --queue bench-1 --payload '{..}'

import { Queue, Worker } from "bullmq";
import IORedis from "ioredis";

function args() {
  const out = { redis: "redis://127.0.0.1:6379", n: 20000, concurrency: 50, queue: "bench", payload: "{}", chunk: 1000 };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "");
    out[key] = ["n", "concurrency", "chunk"].includes(key) ? Number(argv[i + 1]) : argv[i + 1];
  }
  return out;
}

async function commandstats(redis) {
  const text = await redis.info("commandstats");
  const calls = {};
  for (const line of text.split("\n")) {
    const m = line.match(/^cmdstat_([^:]+):calls=(\d+)/);
    if (m) calls[m[1]] = Number(m[2]);
  }
  return calls;
}

async function redisCpu(redis) {
  const text = await redis.info("cpu");
  const field = (name) => Number((text.match(new RegExp(`${name}:([0-9.]+)`)) || [0, "NaN"])[1]);
  return field("used_cpu_user") + field("used_cpu_sys");
}

function delta(before, after) {
  const out = {};
  for (const [name, calls] of Object.entries(after)) {
    if (name === "info") continue;
    const d = calls - (before[name] || 0);
    if (d > 0) out[name] = d;
  }
  return out;
}

const opts = args();
const url = new URL(opts.redis);
const connection = { host: url.hostname, port: Number(url.port || 6379), maxRetriesPerRequest: null };
const stats = new IORedis(connection);
const queue = new Queue(opts.queue, { connection });
await queue.waitUntilReady();

const payload = JSON.parse(opts.payload);
const s0 = await commandstats(stats);
const c0 = await redisCpu(stats);
const enqueueStart = process.hrtime.bigint();
for (let first = 0; first < opts.n; first += opts.chunk) {
  const jobs = [];
  for (let i = first; i < Math.min(first + opts.chunk, opts.n); i++) {
    jobs.push({ name: "noop", data: { ...payload, id: `j${i}` }, opts: { removeOnComplete: true, removeOnFail: true } });
  }
  await queue.addBulk(jobs);
}
const enqueueSecs = Number(process.hrtime.bigint() - enqueueStart) / 1e9;
const s1 = await commandstats(stats);
const c1 = await redisCpu(stats);

let done = 0;
let finish;
const allDone = new Promise((resolve) => (finish = resolve));
const drainStart = process.hrtime.bigint();
const cpuStart = process.cpuUsage();
const worker = new Worker(opts.queue, async () => {}, { connection, concurrency: opts.concurrency });
worker.on("completed", () => {
  done += 1;
  if (done === opts.n) finish(process.hrtime.bigint());
});
worker.on("failed", (job, err) => {
  console.error(`job failed: ${err}`);
});
const drainEnd = await allDone;
const cpuDrain = process.cpuUsage(cpuStart);
const drainSecs = Number(drainEnd - drainStart) / 1e9;
const s2 = await commandstats(stats);
const c2 = await redisCpu(stats);
await worker.close();
const left = await queue.getJobCounts();
await queue.obliterate({ force: true });
await queue.close();
await stats.quit();

console.log(
  JSON.stringify({
    system: "bullmq",
    n: opts.n,
    enqueue_secs: enqueueSecs,
    drain_secs: drainSecs,
    enqueue_commands: delta(s0, s1),
    drain_commands: delta(s1, s2),
    enqueue_redis_cpu_secs: c1 - c0,
    drain_redis_cpu_secs: c2 - c1,
    drain_worker_cpu_secs: (cpuDrain.user + cpuDrain.system) / 1e6,
    left,
  }),
);
process.exit(0);
