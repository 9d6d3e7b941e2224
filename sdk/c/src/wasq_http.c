/* wasq_http.c: a blocking HTTP client over the generated wasi:http 0.2 bindings.
 *
 * The order follows the Rust SDK (sdk/rust/src/http.rs): build the request, take its body,
 * hand it to the outgoing handler, then stream the body and finish it, then block on the
 * response and read its body to the end. The host's egress guard answers refused requests
 * with error codes, which we turn into fatal errors (retrying would be refused again).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "task_world.h"
#include "wasq.h"

/* WIT names of wasi:http error-code cases, as the host logs them. */
static const char *const code_names[] = {
    "DNS-timeout", "DNS-error", "destination-not-found", "destination-unavailable",
    "destination-IP-prohibited", "destination-IP-unroutable", "connection-refused",
    "connection-terminated", "connection-timeout", "connection-read-timeout",
    "connection-write-timeout", "connection-limit-reached", "TLS-protocol-error",
    "TLS-certificate-error", "TLS-alert-received", "HTTP-request-denied",
    "HTTP-request-length-required", "HTTP-request-body-size", "HTTP-request-method-invalid",
    "HTTP-request-URI-invalid", "HTTP-request-URI-too-long",
    "HTTP-request-header-section-size", "HTTP-request-header-size",
    "HTTP-request-trailer-section-size", "HTTP-request-trailer-size",
    "HTTP-response-incomplete", "HTTP-response-header-section-size",
    "HTTP-response-header-size", "HTTP-response-body-size",
    "HTTP-response-trailer-section-size", "HTTP-response-trailer-size",
    "HTTP-response-transfer-coding", "HTTP-response-content-coding", "HTTP-response-timeout",
    "HTTP-upgrade-failed", "HTTP-protocol-error", "loop-detected", "configuration-error",
    "internal-error",
};

static int code_error(wasi_http_types_error_code_t *code, wasq_error *err) {
  uint8_t t = code->tag;
  const char *name = t < sizeof code_names / sizeof *code_names ? code_names[t] : "unknown";
  int rc;
  switch (t) {
  case WASI_HTTP_TYPES_ERROR_CODE_HTTP_REQUEST_DENIED:
  case WASI_HTTP_TYPES_ERROR_CODE_DESTINATION_IP_PROHIBITED:
  case WASI_HTTP_TYPES_ERROR_CODE_CONNECTION_LIMIT_REACHED:
  case WASI_HTTP_TYPES_ERROR_CODE_HTTP_REQUEST_URI_INVALID:
  case WASI_HTTP_TYPES_ERROR_CODE_HTTP_REQUEST_METHOD_INVALID:
    rc = wasq_fatal(err, "HTTP request: %s", name);
    break;
  default:
    rc = wasq_retryable(err, "HTTP request: %s", name);
  }
  wasi_http_types_error_code_free(code);
  return rc;
}

static wasi_http_types_method_t method_of(const char *m) {
  static const char *const known[] = {"GET",     "HEAD",    "POST",  "PUT",  "DELETE",
                                      "CONNECT", "OPTIONS", "TRACE", "PATCH"};
  wasi_http_types_method_t out = {.tag = WASI_HTTP_TYPES_METHOD_OTHER};
  for (uint8_t i = 0; i < sizeof known / sizeof *known; i++)
    if (!strcasecmp(m, known[i])) {
      out.tag = i; /* the WIT cases are declared in this order */
      return out;
    }
  task_world_string_set(&out.val.other, m);
  return out;
}

static void set_timeouts(wasi_http_types_borrow_request_options_t o, uint64_t millis) {
  if (!millis) return;
  wasi_http_types_duration_t ns = millis * 1000000ull;
  wasi_http_types_method_request_options_set_connect_timeout(o, &ns);
  wasi_http_types_method_request_options_set_first_byte_timeout(o, &ns);
  wasi_http_types_method_request_options_set_between_bytes_timeout(o, &ns);
}

/* Writes the whole body (blocking-write-and-flush takes at most 4096 bytes a call). */
static int write_body(wasi_http_types_own_outgoing_body_t body, const wasq_bytes *bytes,
                      wasq_error *err) {
  wasi_http_types_own_output_stream_t out;
  if (!wasi_http_types_method_outgoing_body_write(wasi_http_types_borrow_outgoing_body(body),
                                                  &out))
    return wasq_fatal(err, "HTTP request: body stream already taken");
  wasi_io_streams_borrow_output_stream_t s = wasi_io_streams_borrow_output_stream(out);
  for (size_t off = 0; off < bytes->len;) {
    size_t n = bytes->len - off < 4096 ? bytes->len - off : 4096;
    task_world_list_u8_t chunk = {(uint8_t *)bytes->ptr + off, n};
    wasi_io_streams_stream_error_t e;
    if (!wasi_io_streams_method_output_stream_blocking_write_and_flush(s, &chunk, &e)) {
      wasi_io_streams_stream_error_free(&e);
      wasi_io_streams_output_stream_drop_own(out);
      return wasq_retryable(err, "HTTP request: writing the body failed");
    }
    off += n;
  }
  wasi_io_streams_output_stream_drop_own(out);
  wasi_http_types_error_code_t code;
  if (!wasi_http_types_static_outgoing_body_finish(body, NULL, &code))
    return code_error(&code, err);
  return 0;
}

static int read_response(wasi_http_types_own_incoming_response_t r, wasq_http_response *resp,
                         wasq_error *err) {
  wasi_http_types_borrow_incoming_response_t br = wasi_http_types_borrow_incoming_response(r);
  resp->status = wasi_http_types_method_incoming_response_status(br);
  wasi_http_types_own_headers_t h = wasi_http_types_method_incoming_response_headers(br);
  wasi_http_types_list_tuple2_field_name_field_value_t entries;
  wasi_http_types_method_fields_entries(wasi_http_types_borrow_fields(h), &entries);
  wasi_http_types_fields_drop_own(h);
  resp->headers = calloc(entries.len ? entries.len : 1, sizeof *resp->headers);
  if (!resp->headers) abort();
  for (size_t i = 0; i < entries.len; i++) {
    wasq_bytes name, value;
    wasq_bytes_set(&name, entries.ptr[i].f0.ptr, entries.ptr[i].f0.len);
    wasq_bytes_set(&value, entries.ptr[i].f1.ptr, entries.ptr[i].f1.len);
    resp->headers[i].name = name.ptr;
    resp->headers[i].value = value.ptr;
  }
  resp->header_count = entries.len;
  wasi_http_types_list_tuple2_field_name_field_value_free(&entries);

  wasi_http_types_own_incoming_body_t body;
  if (!wasi_http_types_method_incoming_response_consume(br, &body))
    return wasq_retryable(err, "HTTP request: response body already taken");
  wasi_http_types_own_input_stream_t in;
  if (!wasi_http_types_method_incoming_body_stream(wasi_http_types_borrow_incoming_body(body),
                                                   &in))
    return wasq_retryable(err, "HTTP request: response body stream already taken");
  wasi_io_streams_borrow_input_stream_t s = wasi_io_streams_borrow_input_stream(in);
  size_t len = 0, cap = 0;
  char *buf = NULL;
  int rc = 0;
  for (;;) {
    task_world_list_u8_t chunk;
    wasi_io_streams_stream_error_t e;
    if (!wasi_io_streams_method_input_stream_blocking_read(s, 64 << 10, &chunk, &e)) {
      if (e.tag == WASI_IO_STREAMS_STREAM_ERROR_LAST_OPERATION_FAILED) {
        wasi_http_types_error_code_t code;
        wasi_io_error_borrow_error_t be =
            wasi_io_error_borrow_error(e.val.last_operation_failed);
        if (wasi_http_types_http_error_code(be, &code)) rc = code_error(&code, err);
        else rc = wasq_retryable(err, "HTTP request: reading the body failed");
        wasi_io_streams_stream_error_free(&e);
      }
      break; /* closed: the body is complete */
    }
    if (len + chunk.len + 1 > cap) {
      cap = (len + chunk.len + 1) * 2;
      if (!(buf = realloc(buf, cap))) abort();
    }
    if (chunk.len) memcpy(buf + len, chunk.ptr, chunk.len);
    len += chunk.len;
    task_world_list_u8_free(&chunk);
  }
  wasi_io_streams_input_stream_drop_own(in);
  wasi_http_types_future_trailers_drop_own(wasi_http_types_static_incoming_body_finish(body));
  if (!buf && !(buf = malloc(1))) abort();
  buf[len] = 0;
  resp->body.ptr = buf;
  resp->body.len = len;
  return rc;
}

int wasq_http_request(const char *method, const char *url, const wasq_header *headers,
                      size_t header_count, const wasq_bytes *body, uint64_t timeout_millis,
                      wasq_http_response *resp, wasq_error *err) {
  memset(resp, 0, sizeof *resp);
  /* scheme://authority/path?query#fragment */
  const char *sep = strstr(url, "://");
  if (!sep) return wasq_fatal(err, "HTTP request: %s is not an absolute URL", url);
  wasi_http_types_scheme_t scheme = {.tag = WASI_HTTP_TYPES_SCHEME_OTHER};
  if ((size_t)(sep - url) == 4 && !strncasecmp(url, "http", 4))
    scheme.tag = WASI_HTTP_TYPES_SCHEME_HTTP;
  else if ((size_t)(sep - url) == 5 && !strncasecmp(url, "https", 5))
    scheme.tag = WASI_HTTP_TYPES_SCHEME_HTTPS;
  else
    return wasq_fatal(err, "HTTP request: only http and https URLs, not %s", url);
  const char *auth = sep + 3;
  size_t auth_len = strcspn(auth, "/?#");
  const char *path = auth + auth_len;
  size_t path_len = strcspn(path, "#");
  char *path_q = malloc(path_len + 2);
  if (!path_q) abort();
  snprintf(path_q, path_len + 2, "%s%.*s", *path == '/' ? "" : "/", (int)path_len, path);

  /* Header list, plus content-length for a body. */
  size_t n = header_count + (body ? 1 : 0);
  wasi_http_types_tuple2_field_name_field_value_t *fl = calloc(n ? n : 1, sizeof *fl);
  char clen[24];
  if (!fl) abort();
  for (size_t i = 0; i < header_count; i++) {
    task_world_string_set(&fl[i].f0, headers[i].name);
    fl[i].f1.ptr = (uint8_t *)headers[i].value;
    fl[i].f1.len = headers[i].value ? strlen(headers[i].value) : 0;
  }
  if (body) {
    snprintf(clen, sizeof clen, "%zu", body->len);
    task_world_string_set(&fl[header_count].f0, "content-length");
    fl[header_count].f1.ptr = (uint8_t *)clen;
    fl[header_count].f1.len = strlen(clen);
  }
  wasi_http_types_list_tuple2_field_name_field_value_t list = {fl, n};
  wasi_http_types_own_fields_t fields;
  wasi_http_types_header_error_t herr;
  bool ok = wasi_http_types_static_fields_from_list(&list, &fields, &herr);
  free(fl);
  if (!ok) return wasq_fatal(err, "HTTP request: invalid or forbidden header");

  wasi_http_types_own_outgoing_request_t req = wasi_http_types_constructor_outgoing_request(fields);
  wasi_http_types_borrow_outgoing_request_t b = wasi_http_types_borrow_outgoing_request(req);
  wasi_http_types_method_t m = method_of(method);
  task_world_string_t a, p;
  task_world_string_dup_n(&a, auth, auth_len);
  task_world_string_set(&p, path_q);
  if (!wasi_http_types_method_outgoing_request_set_method(b, &m) ||
      !wasi_http_types_method_outgoing_request_set_scheme(b, &scheme) ||
      (auth_len && !wasi_http_types_method_outgoing_request_set_authority(b, &a)) ||
      !wasi_http_types_method_outgoing_request_set_path_with_query(b, &p)) {
    wasi_http_types_outgoing_request_drop_own(req);
    return wasq_fatal(err, "HTTP request: invalid method or URL: %s %s", method, url);
  }
  task_world_string_free(&a);
  free(path_q);
  wasi_http_types_own_outgoing_body_t out_body;
  if (body) wasi_http_types_method_outgoing_request_body(b, &out_body);

  wasi_http_types_own_request_options_t opts = wasi_http_types_constructor_request_options();
  set_timeouts(wasi_http_types_borrow_request_options(opts), timeout_millis);
  wasi_http_types_own_future_incoming_response_t fut;
  wasi_http_types_error_code_t code;
  if (!wasi_http_outgoing_handler_handle(req, &opts, &fut, &code)) {
    if (body) wasi_http_types_outgoing_body_drop_own(out_body);
    return code_error(&code, err);
  }
  if (body && write_body(out_body, body, err)) {
    wasi_http_types_future_incoming_response_drop_own(fut);
    return -1;
  }

  wasi_http_types_borrow_future_incoming_response_t bf =
      wasi_http_types_borrow_future_incoming_response(fut);
  wasi_io_poll_own_pollable_t ready = wasi_http_types_method_future_incoming_response_subscribe(bf);
  wasi_io_poll_method_pollable_block(wasi_io_poll_borrow_pollable(ready));
  wasi_io_poll_pollable_drop_own(ready);
  wasi_http_types_result_result_own_incoming_response_error_code_void_t got;
  ok = wasi_http_types_method_future_incoming_response_get(bf, &got);
  wasi_http_types_future_incoming_response_drop_own(fut);
  if (!ok || got.is_err) return wasq_retryable(err, "HTTP request: no response");
  if (got.val.ok.is_err) return code_error(&got.val.ok.val.err, err);
  wasi_http_types_own_incoming_response_t r = got.val.ok.val.ok;
  int rc = read_response(r, resp, err);
  wasi_http_types_incoming_response_drop_own(r);
  return rc;
}

const char *wasq_http_header(const wasq_http_response *resp, const char *name) {
  for (size_t i = 0; i < resp->header_count; i++)
    if (!strcasecmp(resp->headers[i].name, name)) return resp->headers[i].value;
  return NULL;
}
