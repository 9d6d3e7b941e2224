// BullMQ's figure for wasq's side-by-side benchmarks: N jobs are added first (addBulk of
// 1000, or one `add` each with IN_FLIGHT in flight), then one Worker at the given
// concurrency drains them; prints one JSON line with the add and drain times and jobs/s.
// With `sync`, it prints "added" once the jobs are in and waits for a line on stdin before
// draining, so that the caller can read Redis's figures between the two phases.
// Usage: node drain.mjs REDIS_PORT N CONCURRENCY [bulk|single] [IN_FLIGHT] [sync]
import { createInterface } from "node:readline";
import { Queue, Worker } from "bullmq";

const [port, n, concurrency] = process.argv.slice(2, 5).map(Number);
const mode = process.argv[5] ?? "bulk";
const inFlight = Number(process.argv[6] ?? 50);
const sync = process.argv[7] === "sync";
const connection = { host: "127.0.0.1", port, maxRetriesPerRequest: null };
const name = `bench-${process.pid}`;
const queue = new Queue(name, { connection });
// {"i":N,"pad":"xxx…"}: 100 bytes of JSON for any N below 10^6, as every benchmark's payload.
const payload = (i) => ({ i, pad: "x".repeat(100 - 17 - String(i).length) });

const t0 = performance.now();
if (mode === "single") {
  let next = 0;
  const lane = async () => {
    while (next < n) {
      const i = next++;
      await queue.add("noop", payload(i));
    }
  };
  await Promise.all(Array.from({ length: inFlight }, lane));
} else {
  for (let i = 0; i < n; i += 1000) {
    const batch = [];
    for (let j = i; j < Math.min(n, i + 1000); j++) batch.push({ name: "noop", data: payload(j) });
    await queue.addBulk(batch);
  }
}
const enqueueMs = performance.now() - t0;

if (sync) {
  console.log("added");
  const lines = createInterface({ input: process.stdin });
  await new Promise((resolve) => lines.once("line", resolve));
  lines.close();
}

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
console.log(JSON.stringify({ system: "bullmq", n, concurrency, mode, enqueue_ms: enqueueMs, drain_ms: drainMs, per_sec: (n * 1000) / drainMs }));
