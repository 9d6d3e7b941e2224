"""Outbound HTTP in the style of ``requests``, over ``wasi:http/outgoing-handler``.

    r = wasq.http.get("https://api.example.com/users/42", timeout=10)
    r.raise_for_status()
    user = r.json()

Only the hosts the deploy allows (``allow_hosts`` in wasq.toml) are reachable; loopback,
private and metadata addresses are refused (``wasq dev --allow-loopback-egress`` lets
allowed hosts on 127.0.0.0/8 through). Redirects are not followed. Requests are blocking.
Put requests with side effects inside a step; ``idempotent=True`` sends the step's
``idempotency-key`` header so a server can deduplicate a body that ran twice.

Failures raise :class:`RequestError` (refused or invalid: fatal; network: retryable);
``raise_for_status`` raises :class:`HTTPError` (4xx fatal except 408/429; 429, 503 with
Retry-After wait that long; other 5xx retryable). Uncaught, they fail the run that way.
"""

from __future__ import annotations

import email.utils
import json as _json
import time
from typing import Any, Mapping, Optional, Union
from urllib.parse import urlencode, urlsplit

from componentize_py_types import Err, Ok
from wit_world.imports import outgoing_handler
from wit_world.imports import wasi_http_types as t
from wit_world.imports.streams import StreamError_Closed

from .durable import idempotency_key
from .errors import Error, Kind

__all__ = ["request", "get", "post", "put", "patch", "delete", "head", "Response",
           "RequestError", "HTTPError"]

_REFUSED = (t.ErrorCode_HttpRequestDenied, t.ErrorCode_DestinationIpProhibited,
            t.ErrorCode_ConnectionLimitReached)
_INVALID = (t.ErrorCode_HttpRequestUriInvalid, t.ErrorCode_HttpRequestMethodInvalid)
_METHODS: dict[str, t.Method] = {
    "GET": t.Method_Get(), "HEAD": t.Method_Head(), "POST": t.Method_Post(),
    "PUT": t.Method_Put(), "DELETE": t.Method_Delete(), "CONNECT": t.Method_Connect(),
    "OPTIONS": t.Method_Options(), "TRACE": t.Method_Trace(), "PATCH": t.Method_Patch()}


class RequestError(Error):
    """No complete response. ``code`` names the wasi:http error-code (e.g.
    ``HttpRequestDenied``) when the host gave one."""

    def __init__(self, message: str, kind: Kind, code: Optional[str] = None) -> None:
        super().__init__(f"HTTP request: {message}")
        self.kind = kind
        self.code = code

    @classmethod
    def of(cls, code: Any) -> "RequestError":
        name = type(code).__name__.removeprefix("ErrorCode_")
        # Payloads are dataclasses (DnsErrorPayload(rcode=..., info_code=None)): keep the
        # fields that say something, e.g. "DnsError rcode='name not resolved'".
        value = getattr(code, "value", None)
        if hasattr(value, "__dataclass_fields__"):
            value = " ".join(f"{k}={v!r}" for k, v in vars(value).items() if v is not None)
        detail = f"{name} {value}" if value not in (None, "") else name
        kind: Kind = "fatal" if isinstance(code, _REFUSED + _INVALID) else "retryable"
        return cls(detail, kind, name)


class HTTPError(Error):
    """From :meth:`Response.raise_for_status`; ``response`` is the response."""

    def __init__(self, response: "Response") -> None:
        super().__init__(f"HTTP {response.status_code} from {response.url}")
        self.response = response
        status = response.status_code
        wait = response._retry_after()
        if status in (429, 503) and wait is not None:
            self.kind, self.retry_after_ms = "retry-after", round(wait * 1000)
        elif status >= 500 or status in (408, 429):
            self.kind = "retryable"
        else:
            self.kind = "fatal"


class Response:
    """A complete response. Header names are lowercase; repeated ones are joined by ", "."""

    def __init__(self, url: str, status_code: int, headers: dict[str, str], content: bytes):
        self.url = url
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def ok(self) -> bool:
        return self.status_code < 400

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return _json.loads(self.content)

    def raise_for_status(self) -> "Response":
        if self.status_code >= 400:
            raise HTTPError(self)
        return self

    def _retry_after(self) -> Optional[float]:
        value = self.headers.get("retry-after", "").strip()
        if value.isdigit():
            return float(value)
        try:
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None

    def __repr__(self) -> str:
        return f"<Response [{self.status_code}]>"


def request(method: str, url: str, *, params: Optional[Mapping[str, Any]] = None,
            data: Union[bytes, str, Mapping[str, Any], None] = None, json: Any = None,
            headers: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None,
            idempotent: bool = False) -> Response:
    """Sends a request and reads the whole response. ``data`` is sent as is (a mapping
    form-encoded), ``json`` as JSON; ``timeout`` (seconds) bounds connecting, the first byte
    and each gap between bytes (the host clamps it); ``idempotent=True`` inside a step adds
    the ``idempotency-key`` header (nothing outside a step)."""
    fields = {k.lower(): str(v) for k, v in (headers or {}).items()}
    body: Optional[bytes] = None
    if json is not None:
        body = _json.dumps(json).encode()
        fields.setdefault("content-type", "application/json")
    elif isinstance(data, Mapping):
        body = urlencode(data).encode()
        fields.setdefault("content-type", "application/x-www-form-urlencoded")
    elif data is not None:
        body = data.encode() if isinstance(data, str) else bytes(data)
    key = idempotency_key() if idempotent else None
    if key is not None:
        fields.setdefault("idempotency-key", key)
    if body is not None:
        fields["content-length"] = str(len(body))
    if params:
        url += ("&" if "?" in url else "?") + urlencode(params)
    status, response_headers, content = _send(method.upper(), url, fields, body, timeout)
    return Response(url, status, response_headers, content)


def get(url: str, **kwargs: Any) -> Response:
    return request("GET", url, **kwargs)


def post(url: str, **kwargs: Any) -> Response:
    return request("POST", url, **kwargs)


def put(url: str, **kwargs: Any) -> Response:
    return request("PUT", url, **kwargs)


def patch(url: str, **kwargs: Any) -> Response:
    return request("PATCH", url, **kwargs)


def delete(url: str, **kwargs: Any) -> Response:
    return request("DELETE", url, **kwargs)


def head(url: str, **kwargs: Any) -> Response:
    return request("HEAD", url, **kwargs)


def _invalid(message: str) -> RequestError:
    return RequestError(message, "fatal", None)


def _send(method: str, url: str, fields: dict[str, str], body: Optional[bytes],
          timeout: Optional[float]) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise _invalid(f"{url!r} is not an absolute http(s) URL")
    try:
        headers = t.Fields.from_list([(k, v.encode("latin-1")) for k, v in fields.items()])
    except (Err, UnicodeEncodeError) as e:
        raise _invalid(f"bad header ({e!r}) among {', '.join(fields)}") from None
    req = t.OutgoingRequest(headers)  # takes ownership of `headers`
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        req.set_method(_METHODS.get(method) or t.Method_Other(method))
        req.set_scheme(t.Scheme_Https() if parts.scheme == "https" else t.Scheme_Http())
        req.set_authority(parts.netloc)
        req.set_path_with_query(path)
        out_body = req.body() if body is not None else None
    except Err:
        raise _invalid(f"cannot build {method} {url}") from None
    options = t.RequestOptions()
    if timeout is not None:
        ns = max(1, round(timeout * 1e9))
        for setter in (options.set_connect_timeout, options.set_first_byte_timeout,
                       options.set_between_bytes_timeout):
            try:
                setter(ns)
            except Err:  # the host may not support a timeout: it then uses its own
                pass
    try:
        future = outgoing_handler.handle(req, options)
    except Err as e:
        raise RequestError.of(e.value) from None
    if out_body is not None and body is not None:
        _write(out_body, body)
    with future:
        with future.subscribe() as ready:
            ready.block()
        got = future.get()
        if got is None or not isinstance(got, Ok):
            raise RequestError("the response was not available", "retryable")
        if isinstance(got.value, Err):
            raise RequestError.of(got.value.value)
        return _read(got.value.value)


def _write(out_body: t.OutgoingBody, body: bytes) -> None:
    try:
        with out_body.write() as stream:  # the stream must be gone before `finish`
            for i in range(0, len(body), 4096):  # blocking-write-and-flush takes <= 4096
                stream.blocking_write_and_flush(body[i:i + 4096])
        t.OutgoingBody.finish(out_body, None)
    except Err as e:
        raise RequestError(f"writing the request body: {e.value!r}", "retryable") from None


def _read(response: t.IncomingResponse) -> tuple[int, dict[str, str], bytes]:
    with response:
        status = response.status()
        headers: dict[str, str] = {}
        with response.headers() as fields:
            for name, value in fields.entries():
                text = value.decode("latin-1")
                headers[name] = f"{headers[name]}, {text}" if name in headers else text
        chunks: list[bytes] = []
        with response.consume() as body, body.stream() as stream:
            while True:
                try:
                    chunks.append(stream.blocking_read(65536))
                except Err as e:
                    if isinstance(e.value, StreamError_Closed):
                        break
                    code = t.http_error_code(e.value.value)
                    if code is not None:
                        raise RequestError.of(code) from None
                    raise RequestError(f"reading the body: {e.value.value.to_debug_string()}",
                                       "retryable") from None
        return status, headers, b"".join(chunks)
