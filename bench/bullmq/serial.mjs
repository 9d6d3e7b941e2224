// BullMQ one job at a time, for wasq's redis_ir benchmark: a Worker at the given
// concurrency, and a producer that adds the next job when the last one completed, N
// times; the queue is otherwise idle, as most queues are most of the time. Prints one JSON
// line. Jobs are not removed afterwards (the caller flushes Redis), so that what Redis
// counts is the jobs' life alone.
// Usage: node serial.mjs REDIS_PORT N CONCURRENCY
import { Queue, Worker } from "bullmq";

const [port, n, concurrency] = process.argv.slice(2, 5).map(Number);
const connection = { host: "127.0.0.1", port, maxRetriesPerRequest: null };
const name = `bench-${process.pid}`;
const queue = new Queue(name, { connection });
// {"i":N,"pad":"xxx…"}: 100 bytes of JSON for any N below 10^6, as every benchmark's payload.
const payload = (i) => ({ i, pad: "x".repeat(100 - 17 - String(i).length) });

const worker = new Worker(name, async () => ({ ok: true }), {
  connection,
  concurrency,
  removeOnComplete: { count: n },
});
await worker.waitUntilReady();
let done = 0;
const t0 = performance.now();
await new Promise((resolve, reject) => {
  worker.on("completed", () => {
    done += 1;
    if (done === n) resolve();
    else queue.add("noop", payload(done)).catch(reject);
  });
  queue.add("noop", payload(0)).catch(reject);
});
const ms = performance.now() - t0;
await worker.close();
await queue.close();
console.log(JSON.stringify({ system: "bullmq", n, concurrency, mode: "serial", ms, per_sec: (n * 1000) / ms }));
