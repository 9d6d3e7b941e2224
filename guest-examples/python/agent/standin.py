#!/usr/bin/env python3
"""A scripted, deterministic stand-in for an OpenAI-style chat-completions API, for the
durable agent example and its tests (stdlib only, no network, no model).

  python3 standin.py --port 8399 [--delay 2]

POST /v1/chat/completions  answers by how many tool results the conversation holds:
                           0 -> asks for get_weather{"city": <city in the question>}
                           1 -> asks for calculator{"expression": "<C> * 9 / 5 + 32"}
                           2 -> the final answer, built from both results
                           Each answer is sent after --delay seconds (so a test can kill
                           the worker mid-conversation); ?delay=S overrides it per request.
GET  /v1/tools/weather?city=Paris   the weather tool: {"city", "temp_c", "conditions"}
GET  /calls                         calls counted per conversation (the request's "user"
                                    field, or "-"): model and tool calls, and every
                                    idempotency-key seen more than once ("repeated")
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
import zlib
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "foggy"]
lock = threading.Lock()
convs: dict[str, dict[str, Any]] = defaultdict(
    lambda: {"model_calls": 0, "tool_calls": 0, "keys": []})
delay = 0.0


def weather(city: str) -> dict[str, Any]:
    # Deterministic per city: a checksum picks the temperature and the sky.
    h = zlib.crc32(city.lower().encode())
    return {"city": city, "temp_c": 5 + h % 25, "conditions": CONDITIONS[h % len(CONDITIONS)]}


def city_of(question: str) -> str:
    m = re.search(r"\bin ([A-Z][\w-]*(?: [A-Z][\w-]*)*)", question)
    return m.group(1) if m else "Paris"


def completion(messages: list[dict[str, Any]]) -> dict[str, Any]:
    n = zlib.crc32(json.dumps(messages, sort_keys=True).encode())  # same question, same id
    question = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
    results = [m.get("content") or "" for m in messages if m.get("role") == "tool"]
    if len(results) == 0:
        call = ("get_weather", {"city": city_of(question)})
    elif len(results) == 1:
        temp = json.loads(results[0]).get("temp_c", 0)
        call = ("calculator", {"expression": f"{temp} * 9 / 5 + 32"})
    else:
        w = json.loads(results[0])
        text = (f"In {w['city']} it is {w['temp_c']}°C ({results[1]}°F) and "
                f"{w['conditions']}.")
        message: dict[str, Any] = {"role": "assistant", "content": text}
        return wrap(message, "stop", n)
    tool_call = {"id": f"call_{len(results) + 1}", "type": "function",
                 "function": {"name": call[0], "arguments": json.dumps(call[1])}}
    return wrap({"role": "assistant", "content": None, "tool_calls": [tool_call]},
                "tool_calls", n)


def wrap(message: dict[str, Any], finish: str, n: int) -> dict[str, Any]:
    return {"id": f"chatcmpl-{n:08x}", "object": "chat.completion", "created": 0,
            "model": "standin-1", "choices": [{"index": 0, "message": message,
                                               "finish_reason": finish}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}


class Handler(BaseHTTPRequestHandler):
    def count(self, conv: str, kind: str) -> None:
        with lock:
            c = convs[conv]
            c[kind] += 1
            key = self.headers.get("idempotency-key")
            if key:
                c["keys"].append(key)

    def reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        if url.path != "/v1/chat/completions":
            return self.reply(404, {"error": {"message": f"no route {url.path}"}})
        try:
            req = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            messages = req["messages"]
        except (ValueError, KeyError, TypeError) as e:
            return self.reply(400, {"error": {"message": f"bad request: {e}"}})
        conv = str(req.get("user") or "-")
        self.count(conv, "model_calls")
        wait = float(parse_qs(url.query).get("delay", [delay])[0])
        time.sleep(wait)
        self.reply(200, completion(messages))

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/v1/tools/weather":
            q = parse_qs(url.query)
            self.count(q.get("conversation", ["-"])[0], "tool_calls")
            return self.reply(200, weather(q.get("city", ["Paris"])[0]))
        if url.path == "/calls":
            with lock:
                out = {conv: {**c, "repeated": sorted({k for k in c["keys"]
                                                       if c["keys"].count(k) > 1})}
                       for conv, c in convs.items()}
            return self.reply(200, out)
        self.reply(404, {"error": {"message": f"no route {url.path}"}})

    def log_message(self, fmt: str, *args: Any) -> None:
        print(f"standin: {self.command} {self.path} -> {fmt % args}", flush=True)


def main() -> None:
    global delay
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=8399)
    p.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    args = p.parse_args()
    delay = args.delay
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"standin: listening on http://127.0.0.1:{args.port} (delay {delay}s)", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
