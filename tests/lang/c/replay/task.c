/* The replay task of tests/tests/languages.rs, in C: step one, a retryable failure on the
 * first attempt, step two. The retry must not run step one's body again. Expected: succeeds
 * on attempt 2, output {"one": 1, "two": 2} and the milliseconds the attempt had left,
 * "step one body ran" logged once. */
#include "wasq.h"

static int handler(const wasq_bytes *input, wasq_bytes *output, wasq_error *err) {
  (void)input;
  wasq_bytes one, two;
  if (!wasq_step_begin("one", &one)) {
    wasq_log_info("step one body ran");
    wasq_bytes_printf(&one, "1");
    wasq_step_complete("one", &one);
  }
  if (wasq_context()->attempt == 1) return wasq_retryable(err, "fail once");
  if (!wasq_step_begin("two", &two)) {
    wasq_log_info("step two body ran");
    wasq_bytes_printf(&two, "2");
    wasq_step_complete("two", &two);
  }
  return wasq_bytes_printf(output, "{\"one\": %s, \"two\": %s, \"left\": %llu}", one.ptr,
                           two.ptr, (unsigned long long)wasq_time_left_ms());
}

WASQ_TASK(handler)
