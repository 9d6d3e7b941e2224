/* The {{name}} task: {"name":"Ada"} -> {"greeting":"Hello, Ada!"}.
 * Build: `wasq build` (runs the `build` command of wasq.toml). See README of the C SDK. */
#include "wasq.h"

static int handler(const wasq_bytes *input, wasq_bytes *output, wasq_error *err) {
  char *name = wasq_json_get_string(input->ptr, "name");
  if (!name) return wasq_fatal(err, "the input needs a \"name\" string, e.g. {\"name\":\"Ada\"}");

  /* A durable step: once it completed, later attempts get its stored output back and
   * skip the body. The step's output is the task's output here. */
  if (!wasq_step_begin("greet", output)) {
    wasq_log_info("greeting %s", name);
    wasq_bytes_printf(output, "{\"greeting\":%s}", wasq_json_string("Hello, %s!", name));
    wasq_step_complete("greet", output);
  }
  return 0;
}

WASQ_TASK(handler)
