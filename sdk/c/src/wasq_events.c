/* wasq_events.c: events and child runs, over the vendored bindings (see wasq.c for the
 * ownership rules). A missing JSON argument is sent as `null`. */
#include <string.h>

#include "wasq_internal.h"
#include "wasq.h"

/* In wasq.c: takes host bytes and makes them a NUL-terminated wasq_bytes. */

bool wasq_wait_for_event(const char *name, const char *event, const char *if_json,
                         uint64_t timeout_millis, wasq_bytes *data) {
  task_world_string_t s = wasq__str(name), ev = wasq__str(event), cond = wasq__str(if_json);
  task_world_list_u8_t got;
  if (wasq_task_step_wait_for_event(&s, &ev, if_json ? &cond : NULL, timeout_millis, &got)) {
    wasq__adopt(got.ptr, got.len, data);
    return true;
  }
  data->ptr = NULL;
  data->len = 0;
  return false;
}

void wasq_send_event(const char *name, const char *event, const char *data_json) {
  const char *d = data_json ? data_json : "null";
  task_world_string_t s = wasq__str(name), ev = wasq__str(event);
  task_world_list_u8_t l = wasq__list(d, strlen(d));
  wasq_task_step_send_event(&s, &ev, &l);
}

char *wasq_invoke(const char *name, const char *function, const char *input_json) {
  const char *in = input_json ? input_json : "null";
  task_world_string_t s = wasq__str(name), f = wasq__str(function), id;
  task_world_list_u8_t l = wasq__list(in, strlen(in));
  wasq_task_step_invoke(&s, &f, &l, &id);
  wasq_bytes b;
  wasq__adopt(id.ptr, id.len, &b);
  return b.ptr;
}

/* A child that failed for good is this run's failure too; retrying would not help. */
static int child_result(bool ok, const char *who, task_world_list_u8_t *got,
                        task_world_string_t *failure, wasq_bytes *output, wasq_error *err) {
  if (ok) {
    wasq__adopt(got->ptr, got->len, output);
    return 0;
  }
  int rc = wasq_fatal(err, "%s failed: %.*s", who, (int)failure->len, (char *)failure->ptr);
  task_world_string_free(failure);
  return rc;
}

int wasq_call(const char *name, const char *function, const char *input_json,
              wasq_bytes *output, wasq_error *err) {
  const char *in = input_json ? input_json : "null";
  task_world_string_t s = wasq__str(name), f = wasq__str(function), failure;
  task_world_list_u8_t l = wasq__list(in, strlen(in)), got;
  bool ok = wasq_task_step_call(&s, &f, &l, &got, &failure);
  return child_result(ok, function, &got, &failure, output, err);
}

int wasq_join(const char *name, const char *run_id, wasq_bytes *output, wasq_error *err) {
  task_world_string_t s = wasq__str(name), id = wasq__str(run_id), failure;
  task_world_list_u8_t got;
  bool ok = wasq_task_step_join(&s, &id, &got, &failure);
  return child_result(ok, run_id, &got, &failure, output, err);
}
