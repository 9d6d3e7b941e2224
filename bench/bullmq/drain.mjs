// BullMQ's figure for wasq's side-by-side benchmark: N no-op jobs are added first (addBulk),
// then one Worker at the given concurrency drains them; prints one JSON line with the
// drain time and jobs/s. Usage: node drain.mjs REDIS_PORT N CONCURRENCY
import { Queue, Worker } from "bullmq";

const [port, n, concurrency] = process.argv.slice(2).map(Number);
const connection = { host: "127.0.0.1", port, maxRetriesPerRequest: null };
const name = `bench-${process.pid}`;
const queue = new Queue(name, { connection });

const t0 = performance.now();
for (let i = 0; i < n; i += 1000) {
  const batch = [];
  for (let j = i; j < Math.min(n, i + 1000); j++) batch.push({ name: "noop", data: { i: j } });
  await queue.addBulk(batch);
}
const enqueueMs = performance.now() - t0;

let done = 0;
let start;
const finished = new Promise((resolve) => {
  const worker = new Worker(name, async () => ({ ok: true }), {
    connection,
    concurrency,
    autorun: false,
    // BullMQ's default keeps every completed job; wasq keeps results too (7 days).
    removeOnComplete: { count: n },
  });
  worker.on("completed", () => {
    done += 1;
    if (done === n) resolve(worker);
  });
  start = performance.now();
  worker.run();
});
const worker = await finished;
const drainMs = performance.now() - start;
await worker.close();
await queue.obliterate({ force: true });
await queue.close();
console.log(JSON.stringify({ system: "bullmq", n, concurrency, enqueue_ms: enqueueMs, drain_ms: drainMs, per_sec: (n * 1000) / drainMs }));
