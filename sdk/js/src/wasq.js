// wasq: write wasq tasks in JavaScript (componentize-js / StarlingMonkey). See README.md.
//
// Everything crossing the host boundary is JSON: the task's input and output, step outputs,
// event data and child-run inputs and outputs, so the CLI and dashboard can show them.
//
// componentize-js runs the module's top level once at build time and snapshots it
// (Wizer): nothing at module level here may call the host.

import { info as hostInfo, timeLeft as hostTimeLeft } from 'wasq:task/context@0.1.0';
import * as host from 'wasq:task/step@0.1.0';
import { write } from 'wasq:task/log@0.1.0';
import { report } from 'wasq:task/progress@0.1.0';

const enc = new TextEncoder();
const dec = new TextDecoder();

// ---------------------------------------------------------------------------------------
// Errors: the class decides the WIT `run-error` case, and so whether the run is retried.
// ---------------------------------------------------------------------------------------

/** Base class of the errors that say how the run should be retried. */
export class WasqError extends Error {
  constructor(message, options) {
    super(String(message), options);
    this.name = new.target.name;
  }
}
/** Retried per the function's retry policy (also what any other uncaught error becomes). */
export class RetryableError extends WasqError {}
/** Never retried: the run ends as failed. */
export class FatalError extends WasqError {}
/** Retried no sooner than `ms` milliseconds from now (e.g. a rate limit's Retry-After). */
export class RetryAfterError extends WasqError {
  constructor(ms, message, options) {
    super(message, options);
    this.ms = Math.max(0, Math.floor(Number(ms) || 0));
  }
}
/** A child run (`call` / `join`) failed or was cancelled; fatal, as retrying won't help. */
export class ChildFailedError extends FatalError {}

// componentize-js turns a thrown `{tag, val}` into the err case of `result<_, run-error>`;
// anything else thrown out of `run` traps the instance, hiding the message.
function runError(e) {
  if (e instanceof RetryAfterError) return { tag: 'retry-after', val: [BigInt(e.ms), e.message] };
  if (e instanceof FatalError) return { tag: 'fatal', val: e.message };
  if (e instanceof WasqError) return { tag: 'retryable', val: e.message };
  // Not ours: retryable, like the Rust and Python SDKs; the stack goes to the run's log.
  const message = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  if (e instanceof Error && e.stack) write('error', `${message}\n${e.stack}`);
  return { tag: 'retryable', val: message };
}

// ---------------------------------------------------------------------------------------
// The `run` export
// ---------------------------------------------------------------------------------------

/**
 * Wraps `handler(input)` (sync or async) as the component's `run` export:
 *   export const run = task(async (input) => ({ ok: true }));
 * Empty input is `null`; input that is not JSON fails the run (fatal) before `handler`.
 * The returned value is sent as JSON (a Uint8Array is sent as is).
 */
export function task(handler) {
  return async function run(input) {
    begun.clear();
    keys.length = 0;
    try {
      let value;
      const text = dec.decode(input);
      try {
        value = text.trim() === '' ? null : JSON.parse(text);
      } catch (e) {
        throw new FatalError(`invalid input: ${e.message}`);
      }
      const output = await handler(value);
      if (output instanceof Uint8Array) return output;
      return encode(output === undefined ? null : output, 'the output');
    } catch (e) {
      throw runError(e);
    }
  };
}

function encode(value, what) {
  let json;
  try {
    json = JSON.stringify(value === undefined ? null : value);
  } catch (e) {
    throw new FatalError(`cannot serialise ${what} as JSON: ${e.message}`);
  }
  return enc.encode(json);
}

function decode(bytes, what) {
  try {
    return JSON.parse(dec.decode(bytes));
  } catch (e) {
    throw new FatalError(`${what} is not JSON: ${e.message}`);
  }
}

// ---------------------------------------------------------------------------------------
// Durable steps
// ---------------------------------------------------------------------------------------

// Steps begun in this attempt, by name: the host keys a step by (name, occurrence).
const begun = new Map();
// Idempotency keys of the step bodies running now, innermost last.
const keys = [];

/**
 * Runs `fn` as the durable step `name` and returns its (JSON) result; a step that completed
 * in an earlier attempt returns its stored result without running `fn`. `fn` gets
 * `{ name, idempotencyKey }` and may be async. If it throws, nothing is stored and the next
 * attempt runs it again. The value is returned as JSON gives it back, on every attempt alike.
 */
export async function step(name, fn) {
  const occurrence = begun.get(name) ?? 0;
  begun.set(name, occurrence + 1);
  const stored = host.begin(name);
  if (stored !== undefined) return decode(stored, `the stored output of step "${name}"`);
  const idempotencyKey = `wasq-${hostInfo().runId}-${name}-${occurrence}`;
  keys.push(idempotencyKey);
  let value;
  try {
    value = await fn({ name, idempotencyKey });
  } finally {
    keys.splice(keys.lastIndexOf(idempotencyKey), 1);
  }
  const bytes = encode(value, `the output of step "${name}"`);
  host.complete(name, bytes);
  return JSON.parse(dec.decode(bytes));
}

/**
 * Inside a step body: `wasq-RUN-NAME-N`, the same each time this step of this run runs, for
 * APIs that deduplicate by a key. `undefined` outside a step body. With several step bodies
 * running at once, use the `idempotencyKey` passed to the body instead.
 */
export function idempotencyKey() {
  return keys[keys.length - 1];
}

/** Milliseconds from a number (ms) or a string such as "500ms", "30s", "5m", "2h", "1d". */
export function millis(duration) {
  if (typeof duration === 'bigint') return duration < 0n ? 0n : duration;
  if (typeof duration === 'string') {
    const m = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$/.exec(duration);
    if (!m) throw new FatalError(`invalid duration ${JSON.stringify(duration)}`);
    const unit = { ms: 1, s: 1e3, m: 6e4, h: 36e5, d: 864e5 }[m[2] ?? 'ms'];
    duration = Number(m[1]) * unit;
  }
  const n = Number(duration);
  if (!Number.isFinite(n)) throw new FatalError(`invalid duration ${String(duration)}`);
  return BigInt(Math.max(0, Math.floor(n)));
}

/**
 * Durable sleep, counted from the first time the run gets here. Long sleeps end the attempt
 * and free the worker; the run is replayed when due (completed steps are not re-run).
 */
export async function sleep(name, duration) {
  host.sleep(name, millis(duration));
}

/** Durable sleep until `when` (a Date or Unix milliseconds). */
export async function sleepUntil(name, when) {
  host.sleepUntil(name, millis(when instanceof Date ? when.getTime() : when));
}

/**
 * Suspends the run until event `event` is sent with data matching `options.if` (an object
 * of dotted paths and the values they must equal); returns its data, or `null` when
 * `options.timeout` (ms or "1h"-style) passes first. No timeout: waits for ever.
 */
export async function waitForEvent(name, event, options = {}) {
  const f = options.if;
  const filter = f === undefined || f === null ? undefined : typeof f === 'string' ? f : JSON.stringify(f);
  const timeout = options.timeout ?? options.timeoutMs;
  let ms = timeout === undefined ? 0n : millis(timeout);
  if (timeout !== undefined && ms === 0n) ms = 1n; // 0 would mean "no limit" to the host
  const data = host.waitForEvent(name, event, filter, ms);
  return data === undefined ? null : decode(data, `the data of event "${event}"`);
}

/** Sends event `event` with `data` once, however often the run is replayed. */
export async function sendEvent(name, event, data = null) {
  host.sendEvent(name, event, encode(data, `the data of event "${event}"`));
}

// ---------------------------------------------------------------------------------------
// Child runs
// ---------------------------------------------------------------------------------------

/** Starts `fn` as a child run and returns its run id (started once, however often replayed). */
export async function invoke(name, fn, input = null) {
  return host.invoke(name, fn, encode(input, `the input of ${fn}`));
}

/** Starts `fn` as a child run, suspends until it ends and returns its output. */
export async function call(name, fn, input = null) {
  return childResult(fn, () => host.call(name, fn, encode(input, `the input of ${fn}`)));
}

/** Suspends until run `runId` (from `invoke`) ends and returns its output. */
export async function join(name, runId) {
  return childResult(`run ${runId}`, () => host.join(name, runId));
}

// componentize-js returns the ok value of an imported `result` and throws the err one.
function childResult(what, f) {
  let bytes;
  try {
    bytes = f();
  } catch (e) {
    const message = e && typeof e === 'object' && 'payload' in e ? e.payload : e;
    throw new ChildFailedError(`${what} failed: ${message}`);
  }
  return decode(bytes, `the output of ${what}`);
}

// ---------------------------------------------------------------------------------------
// Context, progress, logs
// ---------------------------------------------------------------------------------------

/** The run: `{ runId, function, tenant, attempt, maxAttempts, trigger }` (attempt 1 first). */
export function context() {
  const i = hostInfo();
  return {
    runId: i.runId, function: i.function, tenant: i.tenant,
    attempt: i.attempt, maxAttempts: i.maxAttempts, trigger: i.trigger,
  };
}

/**
 * Milliseconds this attempt has left before its time limit (the function's timeout) stops
 * it; 0 once passed. Checkpoint in a step before it: the next attempt goes on from there.
 */
export function timeLeft() {
  return Number(hostTimeLeft());
}

/** Reports progress (0-100) with an optional message; not durable (retries may repeat it). */
export function progress(percent, message) {
  const p = Math.min(100, Math.max(0, Math.round(Number(percent) || 0)));
  report(p, message === undefined || message === null ? undefined : String(message));
}

function text(args) {
  return args
    .map((a) => {
      if (typeof a === 'string') return a;
      if (a instanceof Error) return a.stack ? `${a}\n${a.stack}` : String(a);
      try {
        return JSON.stringify(a) ?? String(a);
      } catch {
        return String(a);
      }
    })
    .join(' ');
}

/** Log lines stored with the run (`wasq runs logs ID`); arguments are joined like console.log. */
export const log = Object.freeze({
  trace: (...args) => write('trace', text(args)),
  debug: (...args) => write('debug', text(args)),
  info: (...args) => write('info', text(args)),
  warn: (...args) => write('warn', text(args)),
  error: (...args) => write('error', text(args)),
});

// ---------------------------------------------------------------------------------------
// Outbound HTTP: the engine's fetch over wasi:http, through the host's egress guard
// ---------------------------------------------------------------------------------------

/**
 * The built-in `fetch`, plus `init.idempotent: true` to send the current step's key as an
 * `Idempotency-Key` header. A request that gets no response (host not in allow_hosts,
 * DNS, connection, timeout) throws a RetryableError; the host logs the reason to the run.
 */
export async function fetch(input, init = {}) {
  const { idempotent, ...rest } = init;
  if (idempotent) {
    const key = idempotencyKey();
    if (key === undefined) throw new FatalError('fetch({ idempotent: true }) outside a step body');
    rest.headers = new Headers(rest.headers);
    rest.headers.set('idempotency-key', key);
  }
  try {
    return await globalThis.fetch(input, rest);
  } catch (e) {
    const url = input instanceof Request ? input.url : String(input);
    throw new RetryableError(`fetch ${rest.method ?? 'GET'} ${url}: ${e.message}`, { cause: e });
  }
}

/**
 * Returns `response` if it is 2xx; otherwise throws: 429 and 503 with a Retry-After in
 * seconds -> RetryAfterError; other 5xx, 408 and 429 -> RetryableError; other -> FatalError.
 */
export async function ensureOk(response) {
  if (response.ok) return response;
  const s = response.status;
  let body = '';
  try {
    body = (await response.text()).slice(0, 300);
  } catch {}
  const message = `HTTP ${s} from ${response.url || 'the server'}${body ? `: ${body}` : ''}`;
  const after = Number(response.headers.get('retry-after'));
  if ((s === 429 || s === 503) && Number.isFinite(after) && after > 0) {
    throw new RetryAfterError(after * 1000, message);
  }
  if (s >= 500 || s === 408 || s === 429) throw new RetryableError(message);
  throw new FatalError(message);
}
