"""An OpenAI Responses request body (/v1/responses) turned into the OpenAI chat body SGLang 0.5.23
builds from it (entrypoints/openai/serving_responses.py renders every non-harmony Responses
request as a chat completion), so the router renders, tokenizes and hashes it through the chat
path and gets SGLang's page hashes.

What SGLang does for a request without `previous_response_id` (one with it continues a history
only its holder has: the router sends it there and computes no features), on a worker without
a tool-call parser (the workers this project launches):

- `instructions` (when not empty) is a leading system message; `input` as a string is one user
  message, as items each becomes a chat message: `message` items keep their role (`developer`
  becomes a system message labelled "Developer instructions:"), content parts input_text /
  output_text become text parts, input_image an image_url part; `function_call` and
  `custom_tool_call` an assistant tool call (arguments that are no JSON object become "{}"),
  their outputs tool messages; `reasoning` an assistant reasoning_content (summary, else
  content, else SGLang's own encrypted_content blob; empty ones are dropped); other types
  are refused;
- runs of assistant messages of one phase merge into one (content joined by a blank line,
  tool calls and reasoning concatenated), so a turn with its function calls is one turn;
- a template that drops a system message in mid-conversation gets all system text joined by a
  blank line into one leading system message;
- function tools stay function tools, custom tools become a function with one string
  parameter, built-in tools are skipped; tool_choice is "none" without such tools;
  reasoning.effort becomes reasoning_effort; chat_template_kwargs pass.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Mapping
from typing import Any

import orjson

from smetric_router.features.errors import FeatureError

Message = dict[str, Any]
_DEVELOPER_LABEL = "Developer instructions:"
_REASONING_BLOB = "sglang-reasoning-v1."  # SGLang's own store=false reasoning encoding
_CUSTOM_INPUT = "input"


def chat_body(body: Mapping[str, Any], inline_system: bool) -> dict[str, Any]:
    """The chat completion body SGLang renders for this Responses body (one without
    previous_response_id). inline_system: whether the chat template renders a system message in
    mid-conversation (anthropic_messages.supports_inline_system)."""
    if "input" not in body:
        raise FeatureError("input: Field required (a string or an array of input items).")
    messages: list[Message] = []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise FeatureError("instructions: expected a string.")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    given = body["input"]
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for i, item in enumerate(given):
            message = _item(item, i)
            if message is not None:
                messages.append(message)
    else:
        raise FeatureError("input: expected a string or an array of input items.")
    messages = _merge_assistants(messages)
    if not inline_system:
        messages = _one_system(messages)
    chat: dict[str, Any] = {"messages": messages}
    if isinstance(body.get("model"), str):
        chat["model"] = body["model"]
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
        chat["tool_choice"] = _tool_choice(body.get("tool_choice", "auto"))
    else:
        chat["tool_choice"] = "none"
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping):
        effort = reasoning.get("effort") or reasoning.get("reasoning_effort")
        if effort is not None:
            chat["reasoning_effort"] = effort
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        chat["chat_template_kwargs"] = kwargs
    return chat


# -- input items ----------------------------------------------------------------------------


def _item(item: object, index: int) -> Message | None:
    if not isinstance(item, dict):
        raise FeatureError(f"input[{index}]: expected an object (an input item).")
    if item.get("role") == "developer":
        item = {**item, "role": "system", "content": _label(item.get("content"))}
    kind = item.get("type")
    if kind == "function_call":
        return _call(item, item.get("name"), _arguments(item.get("arguments")))
    if kind == "custom_tool_call":
        payload = item.get("input") or ""
        args = json.dumps({_CUSTOM_INPUT: payload}, ensure_ascii=False)
        return _call(item, item.get("name"), args)
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {
            "role": "tool",
            "tool_call_id": item.get("call_id"),
            "content": _flatten(item.get("output", "")),
        }
    if kind == "reasoning":
        texts = _texts(item.get("summary")) or _texts(item.get("content"))
        if not texts:
            restored = _reasoning_blob(item.get("encrypted_content"))
            texts = [restored] if restored else []
        return {"role": "assistant", "reasoning_content": "\n".join(texts)} if texts else None
    if kind not in (None, "message"):
        raise FeatureError(f"Unsupported Responses API input item type: {kind!r}")
    content = item.get("content")
    if isinstance(content, list):
        item = {**item, "content": [_part(p) for p in content]}
    return {k: v for k, v in item.items() if v is not None and k not in ("id", "status", "type")}


def _label(content: object) -> object:
    """SGLang labels a developer message's text, as it becomes a system message."""
    if isinstance(content, str):
        return f"{_DEVELOPER_LABEL}\n{content}"
    if isinstance(content, list):
        for i, part in enumerate(content):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                labelled = {**part, "text": f"{_DEVELOPER_LABEL}\n{part['text']}"}
                return [*content[:i], labelled, *content[i + 1 :]]
        return [{"type": "input_text", "text": _DEVELOPER_LABEL}, *content]
    return content


def _arguments(raw: object) -> str:
    """A call's arguments as a JSON object string (SGLang's template reads them as one)."""
    if isinstance(raw, str):
        try:
            parsed = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            parsed = None
        return raw if isinstance(parsed, dict) else "{}"
    if isinstance(raw, dict):
        return orjson.dumps(raw).decode()
    return "{}"


def _call(item: Mapping[str, Any], name: object, arguments: str) -> Message:
    call = {
        "id": item.get("call_id") or item.get("id"),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    return {"role": "assistant", "tool_calls": [call]}


def _flatten(output: object) -> object:
    if isinstance(output, list):
        return "".join(p.get("text", "") for p in output if isinstance(p, dict))
    return output


def _texts(parts: object) -> list[str]:
    if not isinstance(parts, list):
        return []
    return [t for p in parts if isinstance(p, dict) and (t := p.get("text"))]


def _reasoning_blob(blob: object) -> str | None:
    if not isinstance(blob, str) or not blob.startswith(_REASONING_BLOB):
        return None
    try:
        return zlib.decompress(base64.urlsafe_b64decode(blob[len(_REASONING_BLOB) :])).decode()
    except (ValueError, zlib.error, UnicodeDecodeError):
        return None


def _part(part: object) -> object:
    if not isinstance(part, dict):
        return part
    part = {k: v for k, v in part.items() if v is not None}
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": part.get("text", "")}
    if kind == "input_image":
        url = part.get("image_url")
        image = dict(url) if isinstance(url, dict) else {"url": url}
        if not image.get("detail"):
            image["detail"] = part.get("detail") or "auto"
        for key in ("min_dynamic_patch", "max_dynamic_patch", "max_long_side_pixel"):
            if key in part and key not in image:
                image[key] = part[key]
        return {"type": "image_url", "image_url": image}
    if kind == "image_url":
        url = part.get("image_url")
        if isinstance(url, str):
            url = {"url": url, "detail": part.get("detail", "auto")}
        elif isinstance(url, dict):
            url = dict(url)
            if not url.get("detail"):
                url["detail"] = part.get("detail") or "auto"
        return {**part, "image_url": url}
    return part


# -- whole conversation ---------------------------------------------------------------------


def _merge_assistants(messages: list[Message]) -> list[Message]:
    merged: list[Message] = []
    for msg in messages:
        prev = merged[-1] if merged else None
        if (
            prev is None
            or msg.get("role") != "assistant"
            or prev.get("role") != "assistant"
            or not (
                prev.get("phase") == msg.get("phase") or set(prev) == {"role", "reasoning_content"}
            )
        ):
            merged.append(msg)
            continue
        prev = merged[-1] = dict(prev)
        if msg.get("phase") is not None:
            prev["phase"] = msg["phase"]
        new = msg.get("content")
        if new is not None and new != "":
            old = prev.get("content")
            if old is None or old == "":
                prev["content"] = new
            elif isinstance(old, str) and isinstance(new, str):
                prev["content"] = old + "\n\n" + new
            else:
                prev["content"] = _as_parts(old) + _as_parts(new)
        if msg.get("tool_calls"):
            prev["tool_calls"] = (prev.get("tool_calls") or []) + list(msg["tool_calls"])
        if msg.get("reasoning_content"):
            before = prev.get("reasoning_content")
            now = msg["reasoning_content"]
            prev["reasoning_content"] = f"{before}\n{now}" if before else now
    return merged


def _as_parts(content: object) -> list[Any]:
    if isinstance(content, list):
        return list(content)
    if isinstance(content, str) and content:
        return [{"type": "text", "text": content}]
    return []


def _one_system(messages: list[Message]) -> list[Message]:
    chunks: list[str] = []
    others: list[Message] = []
    for m in messages:
        if m.get("role") != "system":
            others.append(m)
            continue
        content = m.get("content")
        if isinstance(content, str):
            chunks.append(content)
        elif isinstance(content, list):
            chunks += [
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            ]
    if chunks:
        return [{"role": "system", "content": "\n\n".join(chunks)}, *others]
    return others


# -- tools ----------------------------------------------------------------------------------


def _tools(tools: object) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise FeatureError("tools: expected an array.")
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise FeatureError(f"tools[{i}]: expected an object.")
        kind, name = tool.get("type"), tool.get("name")
        if kind == "function":
            if not name:
                raise FeatureError(f"tools[{i}]: Function tools must include a name.")
            description, parameters = tool.get("description"), tool.get("parameters")
        elif kind == "custom" and name:
            description = _custom_description(tool.get("description"), tool.get("format"))
            parameters = _custom_parameters()
        else:
            continue  # built-in tools (web_search, ...) are no chat tools
        fn = {"name": name, "description": description, "parameters": parameters}
        fn["strict"] = bool(tool.get("strict") or False)
        out.append({"type": "function", "function": fn})
    return out


def _custom_description(description: object, fmt: object) -> str | None:
    parts = [description] if isinstance(description, str) and description else []
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        syntax = fmt.get("syntax") or "lark"
        parts.append(
            f"The payload must conform to this {syntax} grammar:\n{fmt.get('definition') or ''}"
        )
    return "\n\n".join(parts) or None


def _custom_parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            _CUSTOM_INPUT: {
                "type": "string",
                "description": "The freeform text payload for this tool.",
            }
        },
        "required": [_CUSTOM_INPUT],
        "additionalProperties": False,
    }


def _tool_choice(choice: object) -> object:
    if not isinstance(choice, dict):
        return choice
    fn = choice.get("function")
    name = choice.get("name") or (fn.get("name") if isinstance(fn, dict) else None)
    if choice.get("type") in ("function", "custom") and name:
        return {"type": "function", "function": {"name": name}}
    return "auto"
