/* wasq_json.c: just enough JSON for task inputs and outputs: look up a top-level key of an
 * object, read a string or an integer, and quote a string. Use a real JSON library (e.g.
 * cJSON, a single .c file) for anything nested. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wasq.h"

static const char *skip_ws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  return p;
}

/* p at an opening quote; returns the position after the closing quote, or NULL. */
static const char *skip_string(const char *p) {
  for (p++; *p; p++) {
    if (*p == '\\') {
      if (!*++p) return NULL;
    } else if (*p == '"') {
      return p + 1;
    }
  }
  return NULL;
}

/* Skips one value (string, object, array or literal); NULL if malformed or cut off. */
static const char *skip_value(const char *p) {
  if (*p == '"') return skip_string(p);
  if (*p == '{' || *p == '[') {
    int depth = 0;
    while (*p) {
      if (*p == '"') {
        if (!(p = skip_string(p))) return NULL;
        continue;
      }
      if (*p == '{' || *p == '[') depth++;
      if (*p == '}' || *p == ']') {
        if (--depth == 0) return p + 1;
      }
      p++;
    }
    return NULL;
  }
  const char *start = p;
  while (*p && !strchr(",}] \t\r\n", *p)) p++;
  return p > start ? p : NULL;
}

const char *wasq_json_find(const char *json, const char *key) {
  if (!json || !key) return NULL;
  size_t klen = strlen(key);
  const char *p = skip_ws(json);
  if (*p++ != '{') return NULL;
  for (;;) {
    p = skip_ws(p);
    if (*p != '"') return NULL; /* '}' (empty object or end) or malformed */
    const char *name = p + 1, *end = skip_string(p);
    if (!end) return NULL;
    /* Keys are compared as written: a key spelled with escapes does not match. */
    bool match = (size_t)(end - 1 - name) == klen && !memcmp(name, key, klen);
    p = skip_ws(end);
    if (*p++ != ':') return NULL;
    p = skip_ws(p);
    if (match) return p;
    if (!(p = skip_value(p))) return NULL;
    p = skip_ws(p);
    if (*p++ != ',') return NULL;
  }
}

static int hex4(const char *p) {
  int v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else return -1;
  }
  return v;
}

static char *put_utf8(char *o, unsigned cp) {
  if (cp < 0x80) {
    *o++ = (char)cp;
  } else if (cp < 0x800) {
    *o++ = (char)(0xC0 | cp >> 6);
    *o++ = (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *o++ = (char)(0xE0 | cp >> 12);
    *o++ = (char)(0x80 | (cp >> 6 & 0x3F));
    *o++ = (char)(0x80 | (cp & 0x3F));
  } else {
    *o++ = (char)(0xF0 | cp >> 18);
    *o++ = (char)(0x80 | (cp >> 12 & 0x3F));
    *o++ = (char)(0x80 | (cp >> 6 & 0x3F));
    *o++ = (char)(0x80 | (cp & 0x3F));
  }
  return o;
}

char *wasq_json_get_string(const char *json, const char *key) {
  const char *v = wasq_json_find(json, key), *end;
  if (!v || *v != '"' || !(end = skip_string(v))) return NULL;
  /* The unescaped text is never longer than the escaped one. */
  char *out = malloc((size_t)(end - v)), *o = out;
  if (!out) return NULL;
  for (const char *p = v + 1; p < end - 1; p++) {
    if (*p != '\\') {
      *o++ = *p;
      continue;
    }
    switch (*++p) {
    case 'b': *o++ = '\b'; break;
    case 'f': *o++ = '\f'; break;
    case 'n': *o++ = '\n'; break;
    case 'r': *o++ = '\r'; break;
    case 't': *o++ = '\t'; break;
    case 'u': {
      int cp = hex4(p + 1);
      if (cp < 0) goto bad;
      p += 4;
      /* A surrogate pair spells one code point above U+FFFF. */
      if (cp >= 0xD800 && cp < 0xDC00 && p[1] == '\\' && p[2] == 'u') {
        int lo = hex4(p + 3);
        if (lo >= 0xDC00 && lo < 0xE000) {
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          p += 6;
        }
      }
      o = put_utf8(o, (unsigned)cp);
      break;
    }
    default: *o++ = *p; /* \" \\ \/ */
    }
  }
  *o = 0;
  return out;
bad:
  free(out);
  return NULL;
}

bool wasq_json_get_int(const char *json, const char *key, long long *out) {
  const char *v = wasq_json_find(json, key);
  if (!v || !(*v == '-' || (*v >= '0' && *v <= '9'))) return false;
  char *end;
  long long n = strtoll(v, &end, 10);
  if (*end == '.' || *end == 'e' || *end == 'E') return false;
  *out = n;
  return true;
}

char *wasq_json_string(const char *fmt, ...) {
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (text) vsnprintf(text, (size_t)n + 1, fmt, again);
  va_end(again);
  if (!text) return NULL;
  char *out = malloc((size_t)n * 6 + 3), *o = out; /* worst case: every byte \u00XX */
  if (out) {
    *o++ = '"';
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
      switch (*p) {
      case '"': *o++ = '\\'; *o++ = '"'; break;
      case '\\': *o++ = '\\'; *o++ = '\\'; break;
      case '\n': *o++ = '\\'; *o++ = 'n'; break;
      case '\r': *o++ = '\\'; *o++ = 'r'; break;
      case '\t': *o++ = '\\'; *o++ = 't'; break;
      default:
        if (*p < 0x20) o += sprintf(o, "\\u%04x", *p);
        else *o++ = (char)*p; /* UTF-8 passes through */
      }
    }
    *o++ = '"';
    *o = 0;
  }
  free(text);
  return out;
}
