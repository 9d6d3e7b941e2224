// BullMQ's latency figure for wasq's side-by-side benchmark: how late a job starts running,
// measured under an open-loop load. One Worker (concurrency C, results dropped, finished jobs
// removed) is started first; then a producer adds N jobs one at a time (queue.add, ~100-byte
// JSON data) on a fixed schedule, job i intended for t0 + i/RATE. The producer never waits for
// an add before sending the next one on time (adds are fired and collected, at most 1000 in
// flight), so a slow Redis or a slow client cannot slow the offered load down and hide its own
// delay ("coordinated omission"). Each job carries the time it was *meant* to start, as epoch
// µs computed from the schedule, not from the clock at the moment add() was actually called:
// if the producer itself falls behind (event loop busy, in-flight cap hit), that lag is part
// of what a real client would suffer and must show up in the latency, not be subtracted away.
// The worker's processor, first thing, reads the clock and records now - intended.
//   now:     the job should start at its intended send time.
//   delayed: each job also gets opts.delay uniform in 100..5000 ms and should start at
//            intended send time + delay (BullMQ v5 needs no QueueScheduler: the Worker
//            promotes due delayed jobs itself while fetching; when idle it blocks in BZPOPMIN
//            until the next due time, and an idle Redis only fires that timeout on its next
//            event-loop wake-up, every 1/hz s: up to 100 ms late at the default hz 10).
//   cron:    RATE job schedulers (queue.upsertJobScheduler, pattern "* * * * * *": each
//            fires every second), measured over N / RATE whole seconds of ticks starting two
//            seconds on; a job's intended start is its tick (the nextMillis its scheduler
//            put in its id, `repeat:<scheduler>:<tick>`). The schedulers are removed after.
//   max:     no schedule; N adds as fast as possible, 50 in flight, while the worker drains;
//            achieved_rate is processed jobs/s over the whole window (each system's maximum,
//            to pick the rates for the other modes). Its percentiles are measured from the
//            actual add() call and mean little.
// Unmeasured warm-up jobs run first (see below); N counts only the measured jobs.
// Prints one JSON line; percentiles are nearest-rank over all N jobs. Producer and worker
// share this process, so both clocks are the same clock.
// Usage: node latency.mjs REDIS_PORT MODE RATE N CONCURRENCY   (MODE: now | delayed | max | cron)
import { Queue, Worker } from "bullmq";

const [portArg, mode, rateArg, nArg, concArg] = process.argv.slice(2);
const port = Number(portArg);
const rate = Number(rateArg);
const n = Number(nArg);
const concurrency = Number(concArg);
if (!["now", "delayed", "max", "cron"].includes(mode) || !(n > 0) || !(concurrency > 0) || !(port > 0) || (mode !== "max" && !(rate > 0))) {
  console.error("usage: node latency.mjs REDIS_PORT now|delayed|max|cron RATE N CONCURRENCY");
  process.exit(2);
}

const MAX_IN_FLIGHT = 1000; // open-loop modes
const MAX_MODE_IN_FLIGHT = 50;
const WARMUP = 1000; // burst warm-up jobs, see below
// Open-loop modes: unmeasured lead-in jobs on the same schedule just before the measured ones.
const LEAD_IN = mode === "max" || mode === "cron" ? 0 : Math.max(100, Math.min(10_000, Math.round(2 * rate)));
const epochUs = (perfMs) => Math.round((performance.timeOrigin + perfMs) * 1000);
// Pad so the job data's JSON is ~100 bytes: {"intended":<16 digits>,"pad":"xxx…"}.
const pad = "x".repeat(Math.max(0, 100 - JSON.stringify({ intended: epochUs(performance.now()), pad: "" }).length));

const connection = { host: "127.0.0.1", port, maxRetriesPerRequest: null };
const name = `bench-lat-${process.pid}`;
const queue = new Queue(name, { connection });

const latency = new Float64Array(n);
let recorded = 0;
let finished = 0;
let lastFinish = 0;
let resolveDone;
const allDone = new Promise((resolve) => (resolveDone = resolve));

// cron: the ticks measured, [cronFrom, cronUntil) in epoch ms (set before the schedulers
// start), and every scheduler's job run (for Redis's CPU per job).
let cronFrom = Infinity;
let cronUntil = -Infinity;
let cronRun = 0;
const worker = new Worker(
  name,
  async (job) => {
    const now = epochUs(performance.now());
    if (job.data.warm) return;
    if (mode === "cron") {
      cronRun += 1;
      const tick = Number(job.id.split(":").pop());
      if (tick >= cronFrom && tick < cronUntil && recorded < n) {
        latency[recorded++] = now - tick * 1000;
        if (recorded === n) resolveDone();
      }
      return;
    }
    if (recorded < n) latency[recorded++] = now - job.data.intended;
  },
  { connection, concurrency, removeOnComplete: { count: 0 }, removeOnFail: { count: 0 } },
);
let warmFinished = 0;
let resolveWarm;
const warmDone = new Promise((resolve) => (resolveWarm = resolve));
const onFinished = (job) => {
  if (job?.data?.warm) {
    if (job.data.warm === 1 && ++warmFinished === WARMUP) resolveWarm();
    return;
  }
  if (mode === "cron") return; // counted by the processor
  finished += 1;
  lastFinish = performance.now();
  if (finished === n) resolveDone();
};
worker.on("completed", (job) => onFinished(job));
worker.on("failed", (job, err) => {
  console.error(`job ${job?.id} failed: ${err?.message}`);
  onFinished(job);
});
worker.on("error", (err) => console.error(`worker error: ${err?.message}`));
await queue.waitUntilReady();
await worker.waitUntilReady();

// Give up (rather than hang) if nothing finishes for a minute.
let lastSeen = -1;
const watchdog = setInterval(() => {
  if (finished + warmFinished + cronRun === lastSeen) {
    console.error(`stalled: ${warmFinished}/${WARMUP} warm-up and ${finished}/${n} jobs finished`);
    process.exit(1);
  }
  lastSeen = finished + warmFinished + cronRun;
}, 60_000);

// Warm-up, not measured: the first second of a cold process runs several times slower (V8
// still compiling, ioredis loading BullMQ's Lua scripts on first use), which would otherwise
// dominate the tail. First a burst of plain and short-delayed adds, 50 in flight, drained;
// then, in the open-loop modes, LEAD_IN jobs (~2 s of the load) on the same schedule right
// before the N measured ones, so that measuring starts from a worker already busy at that
// rate rather than from an idle one (that idle-to-busy ramp alone costs ~100 ms at first).
{
  let next = 0;
  const lane = async () => {
    while (next < WARMUP) {
      const i = next++;
      await queue.add("lat", { warm: 1, intended: 0, pad }, i % 2 ? { delay: 1 + (i % 20) } : undefined);
    }
  };
  await Promise.all(Array.from({ length: 50 }, lane));
  await warmDone;
}

let capHits = 0;
let firstSend = 0;
let lastAddDone = 0;
const pending = [];

const schedulers = [];
if (mode === "cron") {
  cronFrom = (Math.floor(Date.now() / 1000) + 2) * 1000;
  cronUntil = cronFrom + Math.round(n / rate) * 1000;
  for (let k = 0; k < rate; k++) {
    const id = `cron${k}`;
    schedulers.push(id);
    await queue.upsertJobScheduler(id, { pattern: "* * * * * *" }, { name: "lat", data: { pad } });
  }
  firstSend = performance.now();
} else if (mode === "max") {
  let next = 0;
  firstSend = performance.now();
  const lane = async () => {
    while (next < n) {
      next += 1;
      await queue.add("lat", { intended: epochUs(performance.now()), pad });
    }
    lastAddDone = Math.max(lastAddDone, performance.now());
  };
  for (let k = 0; k < Math.min(MAX_MODE_IN_FLIGHT, n); k++) pending.push(lane());
} else {
  const periodMs = 1000 / rate;
  const t0 = performance.now() + 5;
  let next = 0;
  let inFlight = 0;
  let waitingForSlot = false;
  let resolveSent;
  const allSent = new Promise((resolve) => (resolveSent = resolve));
  const total = LEAD_IN + n;
  const settle = () => {
    inFlight -= 1;
    if (waitingForSlot) {
      waitingForSlot = false;
      setImmediate(tick);
    }
  };
  const tick = () => {
    const now = performance.now();
    while (next < total && t0 + next * periodMs <= now) {
      if (inFlight >= MAX_IN_FLIGHT) {
        capHits += 1;
        waitingForSlot = true; // resumed by the next add that settles
        return;
      }
      const sendMs = t0 + next * periodMs;
      let intended = epochUs(sendMs);
      let opts;
      if (mode === "delayed") {
        const delay = 100 + Math.floor(Math.random() * 4901);
        opts = { delay };
        intended += delay * 1000;
      }
      inFlight += 1;
      if (next < LEAD_IN) {
        pending.push(queue.add("lat", { warm: 2, intended, pad }, opts).finally(settle));
      } else {
        if (next === LEAD_IN) firstSend = performance.now();
        const p = queue.add("lat", { intended, pad }, opts);
        pending.push(p.then(() => (lastAddDone = Math.max(lastAddDone, performance.now()))).finally(settle));
      }
      next += 1;
    }
    if (next >= total) return resolveSent();
    const wait = t0 + next * periodMs - performance.now();
    if (wait > 1) setTimeout(tick, Math.floor(wait));
    else setImmediate(tick);
  };
  const wait0 = t0 - performance.now();
  setTimeout(tick, Math.max(0, Math.floor(wait0)));
  await allSent;
}
await Promise.all(pending);
await allDone;
clearInterval(watchdog);
for (const id of schedulers) await queue.removeJobScheduler(id);
if (mode === "cron") lastAddDone = performance.now();

// max: processed jobs/s from the first add to the last job finished; otherwise jobs/s
// accepted by Redis from the first measured add call to the last measured add resolved.
const achievedRate = mode === "max" ? (n * 1000) / (lastFinish - firstSend) : (n * 1000) / (lastAddDone - firstSend);
const sorted = latency.subarray(0, recorded).sort();
const rank = (p) => sorted[Math.min(sorted.length, Math.max(1, Math.ceil(p * sorted.length))) - 1];
if (capHits > 0) console.error(`in-flight cap (${MAX_IN_FLIGHT}) hit ${capHits} times`);
if (recorded !== n) console.error(`recorded ${recorded} latencies for ${n} jobs`);
const result = {
  system: "bullmq",
  mode,
  rate,
  n,
  // Every job this process added, the unmeasured warm-up and lead-in included: what the
  // caller divides Redis's CPU by.
  jobs_run: WARMUP + LEAD_IN + (mode === "cron" ? cronRun : n),
  concurrency,
  achieved_rate: achievedRate,
  p50_us: rank(0.5),
  p99_us: rank(0.99),
  p999_us: rank(0.999),
  max_us: sorted[sorted.length - 1],
};
console.log(JSON.stringify(result));
await worker.close();
await queue.obliterate({ force: true });
await queue.close();
