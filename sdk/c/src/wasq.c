/* wasq.c: the C layer over the vendored `wit-bindgen c` bindings (task_world.*).
 *
 * Ownership rules of the generated bindings that this file relies on: arguments passed to
 * imports are borrowed (so C strings can be lent without copying); results of imports are
 * malloc'd by cabi_realloc with their exact length (we grow them by one byte to add a NUL);
 * the export's input is owned by us, and its result is freed by the generated post-return
 * function, so the output must be one malloc'd block.
 */
#include "wasq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wasq_internal.h"

/* Defined in the task's source by WASQ_TASK(fn). */
int wasq__handler(const wasq_bytes *input, wasq_bytes *output, wasq_error *err);

/* ---- Per-attempt state (reset on every `run`, in case the host reuses an instance) ---- */
typedef struct begun {
  struct begun *next;
  unsigned count;
  char name[]; /* step names begun in this attempt, and how often */
} begun;

static begun *begun_names;
static char *key_stack[32]; /* idempotency keys of the step bodies running, innermost last */
static int key_depth;
static wasq_run_info *run_info;

static void reset_state(void) {
  while (begun_names) {
    begun *next = begun_names->next;
    free(begun_names);
    begun_names = next;
  }
  key_depth = 0;
  run_info = NULL; /* leaked on purpose: the instance ends with the attempt */
}

/* Takes ownership of host bytes (ptr, len) and makes them a NUL-terminated wasq_bytes. */
/* Not static: wasq_events.c uses it too. */
void wasq__adopt(uint8_t *ptr, size_t len, wasq_bytes *out) {
  char *p = realloc(ptr, len + 1);
  if (!p) abort(); /* out of memory: trap, the attempt is retried per the policy */
  p[len] = 0;
  out->ptr = p;
  out->len = len;
}

static char *dup_n(const uint8_t *s, size_t len) {
  char *p = malloc(len + 1);
  if (!p) abort();
  memcpy(p, s, len);
  p[len] = 0;
  return p;
}

static char *vformat(const char *fmt, va_list ap) {
  va_list again;
  va_copy(again, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  char *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (p) vsnprintf(p, (size_t)n + 1, fmt, again);
  va_end(again);
  return p;
}

/* ---- Bytes and errors ----------------------------------------------------------------- */
int wasq_bytes_set(wasq_bytes *b, const void *data, size_t len) {
  char *p = malloc(len + 1);
  if (!p) return -1;
  if (len) memcpy(p, data, len);
  p[len] = 0;
  b->ptr = p;
  b->len = len;
  return 0;
}

int wasq_bytes_printf(wasq_bytes *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *p = vformat(fmt, ap);
  va_end(ap);
  if (!p) return -1;
  b->ptr = p;
  b->len = strlen(p);
  return 0;
}

void wasq_bytes_free(wasq_bytes *b) {
  free(b->ptr);
  b->ptr = NULL;
  b->len = 0;
}

static int set_error(wasq_error *err, wasq_error_kind kind, uint64_t ms, const char *fmt,
                     va_list ap) {
  err->kind = kind;
  err->retry_after_ms = ms;
  err->message = vformat(fmt, ap);
  return -1;
}

#define ERROR_FN(name, kind)                                  \
  int name(wasq_error *err, const char *fmt, ...) {           \
    va_list ap;                                               \
    va_start(ap, fmt);                                        \
    set_error(err, kind, 0, fmt, ap);                         \
    va_end(ap);                                               \
    return -1;                                                \
  }
ERROR_FN(wasq_retryable, WASQ_ERR_RETRYABLE)
ERROR_FN(wasq_fatal, WASQ_ERR_FATAL)

int wasq_retry_after(wasq_error *err, uint64_t millis, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_error(err, WASQ_ERR_RETRY_AFTER, millis, fmt, ap);
  va_end(ap);
  return -1;
}

/* ---- The export ------------------------------------------------------------------------ */
bool exports_task_world_run(task_world_list_u8_t *input, task_world_list_u8_t *ret,
                            task_world_run_error_t *err) {
  reset_state();
  wasq_bytes in, out = {0};
  wasq_error e = {0};
  wasq__adopt(input->ptr, input->len, &in);
  int rc = wasq__handler(&in, &out, &e);
  if (rc == 0) {
    if (!out.ptr) wasq_bytes_set(&out, "null", 4); /* keep the output JSON */
    *ret = wasq__list(out.ptr, out.len);
    return true;
  }
  task_world_string_t m;
  if (e.message) {
    task_world_string_dup(&m, e.message);
  } else {
    wasq_bytes b;
    wasq_bytes_printf(&b, "the task returned %d without setting an error", rc);
    m.ptr = (uint8_t *)b.ptr;
    m.len = b.len;
  }
  switch (e.kind) {
  case WASQ_ERR_FATAL:
    err->tag = WASQ_TASK_TYPES_RUN_ERROR_FATAL;
    err->val.fatal = m;
    break;
  case WASQ_ERR_RETRY_AFTER:
    err->tag = WASQ_TASK_TYPES_RUN_ERROR_RETRY_AFTER;
    err->val.retry_after.f0 = e.retry_after_ms;
    err->val.retry_after.f1 = m;
    break;
  default:
    err->tag = WASQ_TASK_TYPES_RUN_ERROR_RETRYABLE;
    err->val.retryable = m;
  }
  return false;
}

/* ---- Context ----------------------------------------------------------------------------- */
const wasq_run_info *wasq_context(void) {
  if (run_info) return run_info;
  wasq_task_context_run_info_t ri;
  wasq_task_context_info(&ri);
  wasq_run_info *r = malloc(sizeof *r);
  if (!r) abort();
  r->run_id = dup_n(ri.run_id.ptr, ri.run_id.len);
  r->function = dup_n(ri.function.ptr, ri.function.len);
  r->tenant = dup_n(ri.tenant.ptr, ri.tenant.len);
  r->trigger = dup_n(ri.trigger.ptr, ri.trigger.len);
  r->attempt = ri.attempt;
  r->max_attempts = ri.max_attempts;
  wasq_task_context_run_info_free(&ri);
  return run_info = r;
}

uint64_t wasq_time_left_ms(void) { return wasq_task_context_time_left(); }

/* ---- Steps -------------------------------------------------------------------------------- */
/* How many times `name` was begun before in this attempt (the host counts the same way). */
static unsigned occurrence(const char *name) {
  for (begun *b = begun_names; b; b = b->next)
    if (!strcmp(b->name, name)) return b->count++;
  size_t n = strlen(name);
  begun *b = malloc(sizeof *b + n + 1);
  if (!b) abort();
  memcpy(b->name, name, n + 1);
  b->count = 1;
  b->next = begun_names;
  begun_names = b;
  return 0;
}

bool wasq_step_begin(const char *name, wasq_bytes *out) {
  unsigned n = occurrence(name);
  task_world_string_t s = wasq__str(name);
  task_world_list_u8_t stored;
  if (wasq_task_step_begin(&s, &stored)) {
    wasq__adopt(stored.ptr, stored.len, out);
    return true;
  }
  out->ptr = NULL;
  out->len = 0;
  if (key_depth < (int)(sizeof key_stack / sizeof *key_stack)) {
    const char *run = wasq_context()->run_id;
    size_t len = strlen(run) + strlen(name) + 32;
    char *key = malloc(len);
    if (!key) abort();
    snprintf(key, len, "wasq-%s-%s-%u", run, name, n);
    key_stack[key_depth] = key;
  }
  key_depth++;
  return false;
}

void wasq_step_complete(const char *name, const wasq_bytes *output) {
  task_world_string_t s = wasq__str(name);
  task_world_list_u8_t l = wasq__list(output ? output->ptr : NULL, output ? output->len : 0);
  wasq_task_step_complete(&s, &l);
  if (key_depth > 0) {
    key_depth--;
    if (key_depth < (int)(sizeof key_stack / sizeof *key_stack)) free(key_stack[key_depth]);
  }
}

const char *wasq_idempotency_key(void) {
  int top = key_depth - 1;
  if (top < 0 || top >= (int)(sizeof key_stack / sizeof *key_stack)) return NULL;
  return key_stack[top];
}

void wasq_sleep(const char *name, uint64_t millis) {
  task_world_string_t s = wasq__str(name);
  wasq_task_step_sleep(&s, millis);
}

void wasq_sleep_until(const char *name, uint64_t unix_millis) {
  task_world_string_t s = wasq__str(name);
  wasq_task_step_sleep_until(&s, unix_millis);
}

/* ---- Logs and progress ------------------------------------------------------------------- */
void wasq_log(wasq_log_level level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *line = vformat(fmt, ap);
  va_end(ap);
  task_world_string_t m = wasq__str(line ? line : fmt);
  wasq_task_log_write((wasq_task_log_level_t)level, &m);
  free(line);
}

void wasq_progress(uint8_t percent, const char *fmt, ...) {
  char *msg = NULL;
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    msg = vformat(fmt, ap);
    va_end(ap);
  }
  task_world_string_t m = wasq__str(msg);
  wasq_task_progress_report(percent > 100 ? 100 : percent, msg ? &m : NULL);
  free(msg);
}
