// Types of wasq.js, for editors and TypeScript checkers (the build uses wasq.js only).

/** JSON values: what inputs, outputs, step results and event data are made of. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
/** Milliseconds, or a string such as "500ms", "30s", "5m", "2h", "1d". */
export type Duration = number | bigint | string;

export class WasqError extends Error {
  constructor(message: string, options?: { cause?: unknown });
}
/** Retried per the function's retry policy (any other uncaught error is too). */
export class RetryableError extends WasqError {}
/** Never retried: the run ends as failed. */
export class FatalError extends WasqError {}
/** Retried no sooner than `ms` milliseconds from now. */
export class RetryAfterError extends WasqError {
  constructor(ms: number, message: string, options?: { cause?: unknown });
  readonly ms: number;
}
/** Thrown by `call` and `join` when the child run failed or was cancelled. */
export class ChildFailedError extends FatalError {}

/** Wraps a handler as the component's `run` export: `export const run = task(...)`. */
export function task<In = any, Out = any>(
  handler: (input: In) => Out | Promise<Out>,
): (input: Uint8Array) => Promise<Uint8Array>;

export interface StepInfo {
  name: string;
  /** `wasq-RUN-NAME-N`: the same every time this step of this run runs. */
  idempotencyKey: string;
}
/** Runs `fn` once per run as the durable step `name`; later attempts get its stored result. */
export function step<T>(name: string, fn: (step: StepInfo) => T | Promise<T>): Promise<T>;
/** The idempotency key of the step body running now; undefined outside a step body. */
export function idempotencyKey(): string | undefined;

/** Durable sleep, counted from the first time the run gets here. */
export function sleep(name: string, duration: Duration): Promise<void>;
/** Durable sleep until a Date or Unix milliseconds. */
export function sleepUntil(name: string, when: Date | number): Promise<void>;
export interface WaitOptions {
  /** Dotted paths into the event's data and the values they must equal. */
  if?: Record<string, Json>;
  /** Give up after this long and return null. Default: wait for ever. */
  timeout?: Duration;
  /** Same as `timeout`, in milliseconds. */
  timeoutMs?: number;
}
/** Suspends until event `event` matching `options.if` is sent; its data, or null on timeout. */
export function waitForEvent<T = any>(name: string, event: string, options?: WaitOptions): Promise<T | null>;
/** Sends an event once per run, however often the run is replayed. */
export function sendEvent(name: string, event: string, data?: Json): Promise<void>;

/** Starts a child run of `fn`; returns its run id. */
export function invoke(name: string, fn: string, input?: Json): Promise<string>;
/** Starts a child run of `fn` and suspends until it ends; returns its output. */
export function call<T = any>(name: string, fn: string, input?: Json): Promise<T>;
/** Suspends until run `runId` ends; returns its output. */
export function join<T = any>(name: string, runId: string): Promise<T>;

export interface RunInfo {
  runId: string;
  function: string;
  tenant: string;
  /** 1 for the first attempt. */
  attempt: number;
  maxAttempts: number;
  /** "api", "event:<name>", "cron:<schedule>" or "child:<run-id>". */
  trigger: string;
}
export function context(): RunInfo;
/** Milliseconds this attempt has left before its time limit stops it; 0 once passed. */
export function timeLeft(): number;
/** Progress (0-100) and an optional message, shown by `wasq run --wait` and the dashboard. */
export function progress(percent: number, message?: string): void;

type LogFn = (...args: unknown[]) => void;
/** Log lines stored with the run. */
export const log: Readonly<{ trace: LogFn; debug: LogFn; info: LogFn; warn: LogFn; error: LogFn }>;

/** Milliseconds of a Duration, as the BigInt the host takes. */
export function millis(duration: Duration): bigint;

/** The built-in fetch; `idempotent: true` sends the step's key as `Idempotency-Key`. */
export function fetch(input: string | URL | Request, init?: RequestInit & { idempotent?: boolean }): Promise<Response>;
/** The response if 2xx; else throws RetryAfterError, RetryableError (5xx, 408, 429) or FatalError. */
export function ensureOk(response: Response): Promise<Response>;
