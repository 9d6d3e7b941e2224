/* Shared by the SDK's own .c files; not part of the API (use wasq.h). */
#ifndef WASQ_INTERNAL_H
#define WASQ_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "task_world.h"
#include "wasq.h"

/* A C string as a WIT string (borrowed: valid while `s` is). */
static inline task_world_string_t wasq__str(const char *s) {
  task_world_string_t t;
  task_world_string_set(&t, s ? s : "");
  return t;
}

/* Bytes as a WIT list<u8> (borrowed). */
static inline task_world_list_u8_t wasq__list(const void *data, size_t len) {
  task_world_list_u8_t l = {(uint8_t *)data, len};
  return l;
}

/* Takes ownership of a buffer the bindings allocated, as wasq_bytes. */
void wasq__adopt(uint8_t *ptr, size_t len, wasq_bytes *out);

#endif
