"""An OpenAI chat request body turned into what SGLang 0.5.23 hands to apply_chat_template
(serving_chat.py, `_process_messages` / `_apply_jinja_template`), for valid requests:

- each message as its pydantic model dumps it (user messages keep role and content; the other
  roles, lower-cased, keep tool_call_id, name, phase, reasoning_content, tool_calls and tools),
  None fields dropped, a None content made "";
- assistant tool calls as {id, index, type, function: {name, arguments}} with string arguments
  parsed to an object (invalid JSON, or JSON that is not an object, is the client's error);
- content parts: with a "string" template the text parts joined by a space; with an "openai" one
  text parts kept, media reduced to {"type": "image"|"video"|"audio"}, others dropped; a tool
  message whose parts are all text then joined by a space as well;
- a final assistant message with string content becomes a user message, or with
  `continue_final_message` is removed and its text appended to the prompt after the template;
- `tools` as their models dump them (the client's key order, absent optional fields as null),
  passed only when tool_choice is not "none" (a named tool_choice passes that tool alone);
- template variables: chat_template_kwargs, reasoning_effort, and the thinking / enable_thinking
  switches SGLang derives from reasoning_effort and `reasoning`.

Not reproduced: SGLang's validation errors beyond tool-call arguments, its built-in (non-Jinja)
conversation templates and Python chat encoders, and server-side --chat-template-kwargs defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from smetric_router.features.errors import FeatureError
from smetric_router.features.template_traits import OPENAI

Message = dict[str, Any]

_GENERIC_ROLES = frozenset(
    ("system", "assistant", "tool", "function", "developer", "latest_reminder", "root")
)
# ChatCompletionMessageGenericParam's fields after role and content, in declaration order
_GENERIC_FIELDS = ("tool_call_id", "name", "phase", "reasoning_content", "tool_calls", "tools")
_TOOL_HOSTS = ("root", "system", "developer")
_MEDIA = {"image_url": "image", "video_url": "video", "audio_url": "audio", "input_audio": "audio"}
_MEDIA_URL_TYPES = frozenset(("image_url", "input_image", "video_url", "audio_url", "input_audio"))
_TEXT_TYPES = ("text", "input_text")
_REASONING_EFFORTS = frozenset(
    ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max")
)


def template_message(message: object, index: int, content_format: str) -> Message:
    """One request message as SGLang's template sees it."""
    if not isinstance(message, dict):
        raise FeatureError(f"messages[{index}] must be an object")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise FeatureError(f"messages[{index}].role must be a non-empty string")
    content = _content(message.get("content"), index)
    if role == "user" or role.lower() not in _GENERIC_ROLES:
        out: Message = {"role": role, "content": content}
    else:
        role = role.lower()
        out = {"role": role, "content": content}
        for name in _GENERIC_FIELDS:
            value = message.get(name)
            if value is None:
                continue
            if name == "tool_calls":
                value = _tool_calls(value, index, parse=role == "assistant")
            elif name == "tools":
                value = [tool_dump(t, f"messages[{index}].tools") for t in _list(value, index)]
            out[name] = value
        if message.get("prefix") is not None:
            out["prefix"] = message["prefix"]
    if isinstance(content, list):
        if content_format == OPENAI:
            parts = _openai_parts(content)
            del out["content"]  # SGLang rebuilds the message: its content moves last
            if role == "tool" and all(p["type"] == "text" for p in parts):
                out["content"] = " ".join(p["text"] for p in parts)
            else:
                out["content"] = parts
        else:
            out["content"] = " ".join(p["text"] for p in content if p.get("type") in _TEXT_TYPES)
    return out


def _content(content: object, index: int) -> str | list[dict[str, Any]]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise FeatureError(f"messages[{index}].content must be a string, null or a list of parts")
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise FeatureError(f"messages[{index}].content parts must be objects with a 'type'")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise FeatureError(f"messages[{index}].content text parts need a string 'text'")
    return content


def _openai_parts(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in parts:
        kind = part["type"]
        if kind in _TEXT_TYPES:
            out.append({"type": "text", "text": part["text"]})
        elif kind in _MEDIA:
            out.append({"type": _MEDIA[kind]})
        elif kind == "tool_reference":
            out.append({"type": "tool_reference", "name": part.get("name")})
    return out


def _list(value: object, index: int) -> list[Any]:
    if not isinstance(value, list):
        raise FeatureError(f"messages[{index}]: expected a list")
    return value


def _tool_calls(value: object, index: int, parse: bool) -> list[dict[str, Any]]:
    out = []
    for call in _list(value, index):
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise FeatureError(f"messages[{index}].tool_calls entries need a 'function' object")
        fn = call["function"]
        arguments = fn.get("arguments")
        if parse and isinstance(arguments, str):
            arguments = parse_arguments(arguments)
        out.append(
            {
                "id": call.get("id"),
                "index": call.get("index"),
                "type": call.get("type", "function"),
                "function": {"name": fn.get("name"), "arguments": arguments},
            }
        )
    return out


def parse_arguments(arguments: str) -> dict[str, Any]:
    """A tool call's JSON arguments as the object SGLang renders them from."""
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        raise FeatureError("Assistant tool call function.arguments must be valid JSON.") from None
    if not isinstance(parsed, dict):
        raise FeatureError("Assistant tool call function.arguments must be a JSON object.")
    return parsed


def tool_dump(tool: object, where: str = "tools") -> dict[str, Any]:
    """A tool definition as SGLang's Tool model dumps it."""
    if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
        raise FeatureError(f"Invalid '{where}': each tool needs a 'function' object.")
    fn: dict[str, Any] = tool["function"]
    values: dict[str, Any] = {
        "description": fn.get("description"),
        "name": fn.get("name"),
        "parameters": fn.get("parameters"),
        "strict": fn.get("strict"),
        "defer_loading": fn.get("defer_loading"),
    }
    if values["defer_loading"] is None:
        values["defer_loading"] = tool.get("defer_loading")
    for optional in ("strict", "defer_loading"):
        if values[optional] is None:
            del values[optional]
    order = [k for k in fn if k in values]
    order += [k for k in values if k not in fn]
    return {
        "type": tool.get("type", "function"),
        "function": {k: values[k] for k in order},
        "defer_loading": tool.get("defer_loading"),
    }


def hosts_tools(message: Message) -> bool:
    """Whether a template-ready message carries tools of its own (system, developer, root)."""
    return message["role"] in _TOOL_HOSTS and bool(message.get("tools"))


def request_tools(body: Mapping[str, Any], hosted: bool) -> list[dict[str, Any]] | None:
    """The `tools` SGLang passes to the template for this request; hosted: whether some message
    carries tools of its own (hosts_tools)."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise FeatureError("Invalid type for 'tools': expected an array.")
    choice = body.get("tool_choice")
    if choice is None:
        choice = "none" if tools is None and not hosted else "auto"
    if not (tools or hosted) or choice == "none":
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        chosen = [tool_dump(t) for t in tools or [] if _tool_name(t) == name]
        return chosen or None
    return [tool_dump(t) for t in tools] if tools else None


def _tool_name(tool: object) -> object:
    fn = tool.get("function") if isinstance(tool, dict) else None
    return fn.get("name") if isinstance(fn, dict) else None


def template_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    """The template variables SGLang adds for this request (besides the special tokens)."""
    effort = body.get("reasoning_effort")
    thinking: bool | None = None
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict):
        given = reasoning.get("effort", reasoning.get("reasoning_effort"))
        if isinstance(given, str) and given in _REASONING_EFFORTS:
            effort = given
        elif isinstance(given, (int, float)) and not isinstance(given, bool):
            effort = float(given)
        enabled = reasoning.get("enabled")
        if enabled is None:
            enabled = reasoning.get("enable", False)
        if isinstance(enabled, str):
            enabled = enabled.strip().lower() in {"1", "true", "yes", "y", "on"}
        if enabled:
            thinking = True
    if effort is not None:
        thinking = effort != "none"
    given_kwargs = body.get("chat_template_kwargs")
    kwargs = dict(given_kwargs) if isinstance(given_kwargs, dict) else {}
    if thinking is not None:
        kwargs.setdefault("thinking", thinking)
        kwargs.setdefault("enable_thinking", thinking)
    out: dict[str, Any] = {} if effort is None else {"reasoning_effort": effort}
    out.update(kwargs)
    return out


def final_turn(messages: list[Message], continue_final: bool) -> tuple[list[Message], str | None]:
    """SGLang's handling of a final assistant message: (messages to render, assistant prefix)."""
    if not messages or messages[-1]["role"] != "assistant":
        return messages, None
    last = messages[-1]["content"]
    if not isinstance(last, str):
        return messages, None
    if continue_final:
        return messages[:-1], last
    return [*messages[:-1], {"role": "user", "content": last}], None


def tool_result_order(raw: Sequence[object]) -> list[int] | None:
    """For templates that pair tool results with calls by id: the message order SGLang renders
    (runs of tool messages carrying media sorted into the order of their calls), or None when
    it is the request's order."""
    order = list(range(len(raw)))
    changed = False
    i = 0
    while i < len(raw):
        message = raw[i]
        i += 1
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls") or []
        start = i
        while i < len(raw) and _is_tool_result(raw[i]):
            i += 1
        run = [(k, raw[k]) for k in range(start, i)]
        ranked = _ranked_run(run, calls)
        if ranked is not None:
            order[start:i] = ranked
            changed = True
    return order if changed else None


def _is_tool_result(message: object) -> bool:
    return isinstance(message, dict) and message.get("role") in ("tool", "function")


def _ranked_run(run: list[tuple[int, Any]], calls: object) -> list[int] | None:
    if len(run) < 2 or not isinstance(calls, list):
        return None
    call_ids = [c.get("id") if isinstance(c, dict) else None for c in calls]
    if None in call_ids or len(set(call_ids)) != len(call_ids):
        return None
    result_ids = [m.get("tool_call_id") for _, m in run]
    if any(r not in call_ids for r in result_ids) or len(set(result_ids)) != len(result_ids):
        return None
    has_media = any(
        isinstance(m.get("content"), list)
        and any(isinstance(p, dict) and p.get("type") in _MEDIA_URL_TYPES for p in m["content"])
        for _, m in run
    )
    if not has_media:
        return None
    position = {call_id: rank for rank, call_id in enumerate(call_ids)}
    ranked = sorted(run, key=lambda km: position[km[1].get("tool_call_id")])
    return [k for k, _ in ranked]
