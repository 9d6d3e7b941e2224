"""A durable AI agent: a loop of model calls and tool calls, each one a wasq step.

Input:  {"question": "What's the weather in Paris?", "api": "http://127.0.0.1:8399",
         "model": "standin-1", "max_turns": 6}
Output: {"answer": "...", "turns": 3, "tools": ["get_weather", "calculator"]}

If the worker dies mid-conversation, the next attempt replays the loop from the top:
completed model and tool calls return their stored results (no tokens paid twice), and
only the call that was in flight is made again, with the same idempotency-key header.
"""

from __future__ import annotations

import ast
import json
import operator
from typing import Any, Callable

import wasq

SYSTEM = "You are a concise assistant. Use the tools for facts and arithmetic."
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}},
]


def chat(api: str, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One model call; returns the assistant message."""
    r = wasq.http.post(f"{api}/v1/chat/completions", timeout=120, idempotent=True, json={
        "model": model, "messages": messages, "tools": TOOLS,
        "user": wasq.context().run_id,  # lets the stand-in count calls per conversation
    })
    r.raise_for_status()  # 5xx/429: retried; other 4xx: the run fails
    message: dict[str, Any] = r.json()["choices"][0]["message"]
    return message


def run_tool(api: str, call: dict[str, Any]) -> str:
    """One tool call; returns the text the model gets back."""
    name = call["function"]["name"]
    args = json.loads(call["function"]["arguments"] or "{}")
    wasq.log.info("tool %s(%s)", name, args)
    if name == "get_weather":  # a remote tool: an HTTP API
        r = wasq.http.get(f"{api}/v1/tools/weather", idempotent=True, timeout=30, params={
            "city": args["city"], "conversation": wasq.context().run_id})
        r.raise_for_status()
        return r.text
    if name == "calculator":  # a local tool: plain computation
        try:
            return str(calculate(args["expression"]))
        except (ValueError, SyntaxError, ArithmeticError) as e:
            return f"error: {e}"  # the model sees it and may try again
    return f"error: no tool named {name!r}"  # told to the model, which may recover


_OPS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Pow: operator.pow, ast.USub: operator.neg}


def calculate(expression: str) -> float:
    """Arithmetic only: numbers, + - * / ** and parentheses (never `eval` model output)."""
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:  # 9**9**9 would spin
                raise ValueError(f"exponent too large in {expression!r}")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"not arithmetic: {expression!r}")
    return round(ev(ast.parse(expression, mode="eval").body), 6)


@wasq.task
def main(input: dict) -> dict:
    if not isinstance(input, dict) or "question" not in input or "api" not in input:
        raise wasq.Fatal('input must be {"question": ..., "api": "http://host:port"}')
    api, model = input["api"].rstrip("/"), input.get("model", "standin-1")
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": input["question"]}]
    used: list[str] = []
    max_turns = int(input.get("max_turns", 6))
    # Deterministic outside steps: each replay rebuilds `messages` from stored results.
    for turn in range(1, max_turns + 1):
        wasq.progress(100 * (turn - 1) // max_turns, f"turn {turn}: asking the model")
        reply = wasq.step(f"model-{turn}", chat, api, model, messages)
        messages.append(reply)
        calls = reply.get("tool_calls") or []
        if not calls:
            wasq.progress(100, "answered")
            return {"answer": reply.get("content"), "turns": turn, "tools": used}
        for call in calls:
            name = call["function"]["name"]
            result = wasq.step(f"tool-{turn}-{name}", run_tool, api, call)
            used.append(name)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    raise wasq.Fatal(f"no answer after {max_turns} turns")
