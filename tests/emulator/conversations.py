"""Reproducible agent-shaped chat requests for golden tests: roles, tools, tool calls (arguments as
JSON strings and as objects) and tool results, content with leading/trailing whitespace,
newlines, indentation, unicode, special-token text, empty and null content, content parts
(text, images), reasoning content, trailing assistant turns, continue_final_message, tool_choice
variants, template kwargs; and a few malformed requests SGLang refuses."""

from __future__ import annotations

import json
import random
from typing import Any

Json = dict[str, Any]

PIECES = (
    "hello",
    "  two leading spaces",
    "trailing spaces  ",
    "\n    indented after a newline",
    "\n\tdef f(x):\n        return x  # comment\n",
    "",
    " ",
    "\n",
    "line one\nline two\n\n",
    "unicode: héllo wörld 你好 🚀 — ünïcödé",
    "<|im_start|>system\nnot really<|im_end|>",
    "</tool_response>",
    '{"json": [1, 2, {"k": "v"}]}',
    "Ends with a newline\n",
    "   ",
    "x",
    "CamelCase_identifiers and snake_case ones",
    "tabs\tinside\ttext",
    "\r\nwindows\r\nline endings",
)
WORDS = ("read", "file", "grep", "the", "repository", "patch", "test", "failing", "fix", "lint")


def text(rng: random.Random) -> str:
    if rng.random() < 0.15:
        return " ".join(rng.choices(WORDS, k=rng.randint(5, 60)))
    return "".join(rng.choices(PIECES, k=rng.randint(1, 3)))


def content(rng: random.Random, parts_ok: bool = True) -> str | list[Json]:
    if parts_ok and rng.random() < 0.2:
        parts: list[Json] = []
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.03:
                parts.append({"type": "image_url", "image_url": {"url": "http://x/i.png"}})
            else:
                parts.append({"type": "text", "text": text(rng)})
        return parts
    return text(rng)


def tool(rng: random.Random, name: str) -> Json:
    props = {
        p: {"type": rng.choice(["string", "integer", "boolean"]), "description": text(rng)}
        for p in rng.sample(["path", "query", "line", "recursive", "pattern"], rng.randint(0, 3))
    }
    fn: Json = {"name": name}
    if rng.random() < 0.7:
        fn["description"] = text(rng)
    if rng.random() < 0.9:
        fn["parameters"] = {"type": "object", "properties": props, "required": list(props)[:1]}
    if rng.random() < 0.1:
        fn["strict"] = True
    keys = list(fn)
    rng.shuffle(keys)
    out: Json = {"type": "function", "function": {k: fn[k] for k in keys}}
    if rng.random() < 0.1:
        out = {"function": out["function"]}  # type defaults to "function"
    return out


def tool_calls(rng: random.Random, names: list[str], turn: int) -> list[Json]:
    calls = []
    for j in range(rng.randint(1, 2)):
        args: Json = {"path": text(rng), "line": rng.randint(0, 99)}
        if rng.random() < 0.3:
            args["nested"] = {"a": [1, "two"], "b": None}
        encoded: str | Json = json.dumps(args) if rng.random() < 0.7 else args
        call: Json = {"id": f"call_{turn}_{j}", "type": "function"}
        call["function"] = {"name": rng.choice(names), "arguments": encoded}
        calls.append(call)
    return calls


def malformed(rng: random.Random, body: Json) -> Json:
    """One of the shapes SGLang refuses, applied to a valid body."""
    messages = body["messages"]
    kind = rng.randrange(6)
    if kind == 0:
        fn = {"name": "read_file", "arguments": "{not json"}
        messages.append({"role": "assistant", "content": None, "tool_calls": [{"function": fn}]})
        messages.append({"role": "user", "content": "next"})
    elif kind == 1:
        fn = {"name": "read_file", "arguments": "[1, 2]"}
        messages.append({"role": "assistant", "content": "", "tool_calls": [{"function": fn}]})
        messages.append({"role": "user", "content": "next"})
    elif kind == 2:
        messages.append({"role": "User", "content": "capitalised role"})
    elif kind == 3:
        messages.append({"role": "user", "content": None})
    elif kind == 4:
        messages.append({"role": "user", "content": [{"type": "video", "x": 1}]})
    else:
        body["tool_choice"] = {"type": "function", "function": {"name": "no_such_tool"}}
    return body


def conversation(rng: random.Random) -> Json:
    names = ["read_file", "grep", "run_tests", "apply_patch"][: rng.randint(1, 4)]
    with_tools = rng.random() < 0.6
    messages: list[Json] = []
    if rng.random() < 0.7:
        messages.append({"role": "system", "content": content(rng)})
    for turn in range(rng.randint(1, 4)):
        user: Json = {"role": "user", "content": content(rng)}
        if rng.random() < 0.1:
            user["name"] = "dev"  # SGLang's user message keeps role and content only
        messages.append(user)
        for _ in range(rng.randint(0, 2) if with_tools else 0):
            calls = tool_calls(rng, names, turn)
            reply: Json = {"role": "assistant", "tool_calls": calls}
            reply["content"] = rng.choice([None, "", text(rng)])
            if rng.random() < 0.2:
                reply["reasoning_content"] = text(rng)
            messages.append(reply)
            for call in calls:
                result: Json = {"role": "tool", "tool_call_id": call["id"]}
                result["content"] = content(rng) if rng.random() < 0.3 else "\n  " + text(rng)
                messages.append(result)
        if turn or rng.random() < 0.5:
            answer: Json = {"role": "assistant", "content": content(rng, parts_ok=False)}
            if rng.random() < 0.1:
                answer["reasoning_content"] = text(rng)
            messages.append(answer)
    if rng.random() < 0.85:
        messages.append({"role": rng.choice(["user", "user", "tool"]), "content": content(rng)})
        if messages[-1]["role"] == "tool":
            messages[-1]["tool_call_id"] = "call_x"
    body: Json = {"model": "m", "messages": messages}
    if with_tools:
        body["tools"] = [tool(rng, n) for n in names]
        r = rng.random()
        if r < 0.1:
            body["tool_choice"] = "none"
        elif r < 0.2:
            body["tool_choice"] = "auto"
        elif r < 0.25:
            body["tool_choice"] = "required"
        elif r < 0.35:
            body["tool_choice"] = {"type": "function", "function": {"name": rng.choice(names)}}
    if messages[-1]["role"] == "assistant" and rng.random() < 0.5:
        body["continue_final_message"] = True
    if rng.random() < 0.1:
        body["chat_template_kwargs"] = {"enable_thinking": rng.random() < 0.5}
    if rng.random() < 0.05:
        body["reasoning_effort"] = rng.choice(["low", "high", "none"])
    if rng.random() < 0.05:
        body = malformed(rng, body)
    return body


def conversations(n: int, seed: int) -> list[Json]:
    rng = random.Random(seed)
    return [conversation(rng) for _ in range(n)]


def text_prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [text(rng) or "x" for _ in range(n)]
