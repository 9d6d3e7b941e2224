/* checksum: halves a grayscale image and checksums the result, in two durable steps.
 *
 * Input:  {"width": 4, "height": 2, "pixels": [0, 10, 20, 30, 40, 50, 60, 70]}
 *         (row-major, one 0..255 value per pixel)
 * Output: {"width": 2, "height": 1, "pixels": [25, 45], "crc32": "…", "adler32": "…"}
 *
 * Step "downscale" averages each 2x2 block (an odd last row/column is dropped) and stores
 * the small image as JSON; step "checksum" reads that stored JSON back, so on a retry the
 * second step works from exactly what the first one stored.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wasq.h"

#define MAX_SIDE 4096

/* Reads the image of a JSON object into *w, *h and a malloc'd pixel array. */
static int parse_image(const char *json, long long *w, long long *h, unsigned char **px,
                       wasq_error *err) {
  if (!wasq_json_get_int(json, "width", w) || !wasq_json_get_int(json, "height", h) ||
      *w < 1 || *h < 1 || *w > MAX_SIDE || *h > MAX_SIDE)
    return wasq_fatal(err, "width and height must be integers in 1..%d", MAX_SIDE);
  const char *p = wasq_json_find(json, "pixels");
  if (!p || *p++ != '[') return wasq_fatal(err, "pixels must be an array of numbers");
  size_t n = (size_t)(*w * *h), i = 0;
  *px = malloc(n);
  if (!*px) return wasq_fatal(err, "image too large for the memory limit");
  for (;;) {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t' || *p == ',') p++;
    if (*p == ']') break;
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 0 || v > 255) return wasq_fatal(err, "pixel %zu is not in 0..255", i);
    if (i == n) return wasq_fatal(err, "more than width*height = %zu pixels", n);
    (*px)[i++] = (unsigned char)v;
    p = end;
  }
  if (i != n) return wasq_fatal(err, "%zu pixels, expected width*height = %zu", i, n);
  return 0;
}

/* Formats an image as the JSON object the steps store. */
static void image_json(wasq_bytes *out, long long w, long long h, const unsigned char *px) {
  size_t n = (size_t)(w * h);
  char *text = malloc(n * 4 + 64), *o = text;
  if (!text) abort();
  o += sprintf(o, "{\"width\":%lld,\"height\":%lld,\"pixels\":[", w, h);
  for (size_t i = 0; i < n; i++) o += sprintf(o, i ? ",%u" : "%u", px[i]);
  strcpy(o, "]}");
  out->ptr = text;
  out->len = strlen(text);
}

static uint32_t crc32(const unsigned char *p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  while (n--) {
    c ^= *p++;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
  }
  return ~c;
}

static uint32_t adler32(const unsigned char *p, size_t n) {
  uint32_t a = 1, b = 0;
  while (n--) {
    a = (a + *p++) % 65521;
    b = (b + a) % 65521;
  }
  return b << 16 | a;
}

static int handler(const wasq_bytes *input, wasq_bytes *output, wasq_error *err) {
  long long w, h;
  unsigned char *px;
  if (parse_image(input->ptr, &w, &h, &px, err)) return -1;
  if (w < 2 || h < 2) return wasq_fatal(err, "the image must be at least 2x2");

  wasq_bytes small;
  if (!wasq_step_begin("downscale", &small)) {
    long long sw = w / 2, sh = h / 2;
    unsigned char *out = malloc((size_t)(sw * sh));
    if (!out) return wasq_fatal(err, "image too large for the memory limit");
    for (long long y = 0; y < sh; y++)
      for (long long x = 0; x < sw; x++) {
        const unsigned char *q = px + (2 * y) * w + 2 * x;
        out[y * sw + x] = (unsigned char)((q[0] + q[1] + q[w] + q[w + 1] + 2) / 4);
      }
    wasq_log_info("downscaled %lldx%lld to %lldx%lld", w, h, sw, sh);
    image_json(&small, sw, sh, out);
    wasq_step_complete("downscale", &small);
  }
  wasq_progress(50, "downscaled");

  wasq_bytes sums;
  if (!wasq_step_begin("checksum", &sums)) {
    long long sw, sh;
    unsigned char *spx;
    if (parse_image(small.ptr, &sw, &sh, &spx, err)) return -1;
    size_t n = (size_t)(sw * sh);
    wasq_bytes_printf(&sums, "{\"crc32\":\"%08x\",\"adler32\":\"%08x\"}", crc32(spx, n),
                      adler32(spx, n));
    wasq_log_info("checksums of %zu pixels: %s", n, sums.ptr);
    wasq_step_complete("checksum", &sums);
  }
  /* Both are JSON objects: splice them into one ({...a} + {...b}). */
  return wasq_bytes_printf(output, "%.*s,%s", (int)small.len - 1, small.ptr, sums.ptr + 1);
}

WASQ_TASK(handler)
