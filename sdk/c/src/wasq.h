/* wasq.h: write wasq tasks in C (world wasq:task/task@0.1.0).
 *
 * A task is one function; WASQ_TASK(fn) makes it the component's `run` export:
 *
 *     static int handler(const wasq_bytes *input, wasq_bytes *output, wasq_error *err) {
 *         ...                        // input->ptr is the JSON input, NUL-terminated
 *         return wasq_bytes_printf(output, "{\"ok\":true}");   // 0 = success
 *     }
 *     WASQ_TASK(handler)
 *
 * Memory: every attempt runs in a fresh instance that is thrown away when it ends, so the
 * buffers and strings this SDK returns (malloc'd) may simply be left to the attempt's end;
 * free them (wasq_bytes_free, free) only in long loops.
 *
 * Code outside steps re-runs on every attempt (after a retryable error, a trap, a durable
 * sleep or event wait that suspended the run): keep it deterministic, and put side effects
 * and non-deterministic values (time, randomness, HTTP) inside steps.
 */
#ifndef WASQ_H
#define WASQ_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WASQ_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* Bytes from or for the host. Everything the SDK hands you is NUL-terminated after `len`
 * bytes, so JSON text can be used as a C string. */
typedef struct wasq_bytes {
  char *ptr;
  size_t len;
} wasq_bytes;

/* Replaces *b with formatted text. Returns 0 (so `return wasq_bytes_printf(output, ...)`
 * ends a handler successfully), -1 when out of memory. */
int wasq_bytes_printf(wasq_bytes *b, const char *fmt, ...) WASQ_PRINTF(2, 3);
/* Replaces *b with a copy of len bytes of data. Returns 0, -1 when out of memory. */
int wasq_bytes_set(wasq_bytes *b, const void *data, size_t len);
void wasq_bytes_free(wasq_bytes *b);

/* ---- Errors: why the run failed, and whether it is retried ------------------------- */
typedef enum wasq_error_kind {
  WASQ_ERR_NONE = 0,
  WASQ_ERR_RETRYABLE,   /* retried per the function's retry policy */
  WASQ_ERR_FATAL,       /* never retried: the run ends as failed */
  WASQ_ERR_RETRY_AFTER, /* retried after at least retry_after_ms */
} wasq_error_kind;

typedef struct wasq_error {
  wasq_error_kind kind;
  uint64_t retry_after_ms;
  char *message;
} wasq_error;

/* Each sets *err and returns -1: `return wasq_fatal(err, "bad width %d", w);`.
 * A handler that returns non-zero without setting err fails retryably. */
int wasq_retryable(wasq_error *err, const char *fmt, ...) WASQ_PRINTF(2, 3);
int wasq_fatal(wasq_error *err, const char *fmt, ...) WASQ_PRINTF(2, 3);
int wasq_retry_after(wasq_error *err, uint64_t millis, const char *fmt, ...) WASQ_PRINTF(3, 4);

/* ---- The entry point ---------------------------------------------------------------- */
/* The handler's output should be JSON (shown as JSON by the CLI, API and dashboard). */
typedef int (*wasq_handler)(const wasq_bytes *input, wasq_bytes *output, wasq_error *err);

#define WASQ_TASK(fn)                                                                     \
  int wasq__handler(const wasq_bytes *input, wasq_bytes *output, wasq_error *err) {       \
    return (fn)(input, output, err);                                                      \
  }

/* ---- Durable steps ------------------------------------------------------------------ */
/* Begins step `name`. Returns true when it completed in an earlier attempt: *out is its
 * stored output, skip the body. Returns false: run the body, fill *out, then call
 * wasq_step_complete(name, out). A body that fails (you return an error before complete)
 * stores nothing and runs again on the next attempt:
 *
 *     wasq_bytes user;
 *     if (!wasq_step_begin("load-user", &user)) {
 *         ... side effects ...
 *         wasq_bytes_printf(&user, "{\"id\":%d}", id);
 *         wasq_step_complete("load-user", &user);
 *     }
 *
 * Names may repeat: steps are matched by name and by how many times that name was begun
 * before in the attempt. Store JSON, so the dashboard can show it. */
bool wasq_step_begin(const char *name, wasq_bytes *out);
void wasq_step_complete(const char *name, const wasq_bytes *output);

/* Inside a step body: "wasq-RUN-NAME-N", the same every time this step's body runs, for
 * APIs that deduplicate by key (e.g. an Idempotency-Key header). NULL outside a body. */
const char *wasq_idempotency_key(void);

/* Durable sleep, a step named `name`: the wake-up time is fixed the first time the run gets
 * here. Long sleeps suspend the run (the worker is freed) and replay it when due. */
void wasq_sleep(const char *name, uint64_t millis);
void wasq_sleep_until(const char *name, uint64_t unix_millis);

/* ---- Events ------------------------------------------------------------------------- */
/* Suspends the run until an event `event` is sent whose data matches `if_json` (a JSON
 * object of dotted paths and values, e.g. "{\"user_id\":42}"; NULL matches any). Returns
 * true with *data = the event's JSON data, false when timeout_millis passed first (0 =
 * wait forever). Only events sent after the run started waiting count. */
bool wasq_wait_for_event(const char *name, const char *event, const char *if_json,
                         uint64_t timeout_millis, wasq_bytes *data);
/* Sends event `event` with JSON `data_json`, once however often the run is replayed. */
void wasq_send_event(const char *name, const char *event, const char *data_json);

/* ---- Child runs --------------------------------------------------------------------- */
/* Starts `function` with JSON input as a child run; returns its run id (replays return
 * the same id and start nothing). */
char *wasq_invoke(const char *name, const char *function, const char *input_json);
/* Starts a child run and suspends until it ends (no worker held). Returns 0 with *output
 * = its output, or -1 with a fatal *err when it failed or was cancelled. */
int wasq_call(const char *name, const char *function, const char *input_json,
              wasq_bytes *output, wasq_error *err);
/* Suspends until run `run_id` (from wasq_invoke) ends; like wasq_call. */
int wasq_join(const char *name, const char *run_id, wasq_bytes *output, wasq_error *err);

/* ---- Logs, progress, run facts ------------------------------------------------------ */
typedef enum wasq_log_level {
  WASQ_TRACE, WASQ_DEBUG, WASQ_INFO, WASQ_WARN, WASQ_ERROR,
} wasq_log_level;

/* One log line stored with the run (printf-style). Lines written in a step body are
 * written again only if that body runs again. stdout/stderr are captured separately. */
void wasq_log(wasq_log_level level, const char *fmt, ...) WASQ_PRINTF(2, 3);
#define wasq_log_trace(...) wasq_log(WASQ_TRACE, __VA_ARGS__)
#define wasq_log_debug(...) wasq_log(WASQ_DEBUG, __VA_ARGS__)
#define wasq_log_info(...) wasq_log(WASQ_INFO, __VA_ARGS__)
#define wasq_log_warn(...) wasq_log(WASQ_WARN, __VA_ARGS__)
#define wasq_log_error(...) wasq_log(WASQ_ERROR, __VA_ARGS__)

/* Progress shown by `wasq run --wait`, the API and the dashboard; fmt may be NULL. */
void wasq_progress(uint8_t percent, const char *fmt, ...) WASQ_PRINTF(2, 3);

typedef struct wasq_run_info {
  const char *run_id;
  const char *function;
  const char *tenant;
  uint32_t attempt; /* 1 for the first attempt: branch on it only inside a step body */
  uint32_t max_attempts;
  const char *trigger; /* "api", "event:<name>", "cron:<schedule>", "child:<run-id>" */
} wasq_run_info;

const wasq_run_info *wasq_context(void);

/* Milliseconds this attempt has left before its time limit (the function's timeout) stops
 * it; 0 once passed. Checkpoint in a step before it: the next attempt goes on from there. */
uint64_t wasq_time_left_ms(void);

/* ---- Tiny JSON helpers (no parser needed for simple inputs) ------------------------- */
/* Points at the value of top-level key `key` in JSON object `json` (whitespace skipped),
 * or NULL. Parse it further with strtol/strtod, or with the getters below. */
const char *wasq_json_find(const char *json, const char *key);
/* The unescaped string value of top-level `key` (malloc'd), or NULL if absent or not a
 * string. \u escapes outside ASCII become UTF-8. */
char *wasq_json_get_string(const char *json, const char *key);
/* The integer value of top-level `key`; false if absent or not an integer. */
bool wasq_json_get_int(const char *json, const char *key, long long *out);
/* Formats text, then returns it as a quoted, escaped JSON string literal (malloc'd):
 * wasq_bytes_printf(out, "{\"greeting\":%s}", wasq_json_string("Hello, %s!", name)). */
char *wasq_json_string(const char *fmt, ...) WASQ_PRINTF(1, 2);

/* ---- Outbound HTTP (wasq_http.c): only to the hosts the deploy allows (allow_hosts) ---- */
typedef struct wasq_header {
  const char *name;
  const char *value;
} wasq_header;

typedef struct wasq_http_response {
  uint16_t status;
  wasq_header *headers; /* lower-case names */
  size_t header_count;
  wasq_bytes body;
} wasq_http_response;

/* A blocking request to an absolute http(s) URL; headers may be NULL, body may be NULL.
 * Returns 0 with *resp filled for any status (check resp->status yourself), or -1 with
 * *err set: fatal when the request is invalid or refused by the host's egress guard
 * (host not allowed, private address...), retryable when it failed (DNS, connection,
 * timeout). Inside a step, add {"idempotency-key", wasq_idempotency_key()} for APIs
 * that deduplicate. timeout_millis applies to connecting and to each wait for bytes
 * (0 = the host's defaults). */
int wasq_http_request(const char *method, const char *url, const wasq_header *headers,
                      size_t header_count, const wasq_bytes *body, uint64_t timeout_millis,
                      wasq_http_response *resp, wasq_error *err);
/* The first value of header `name` (any case) in resp, or NULL. */
const char *wasq_http_header(const wasq_http_response *resp, const char *name);

#ifdef __cplusplus
}
#endif
#endif
