"""What SGLang 0.5.23's request models keep of a chat request (sglang/srt/entrypoints/openai/
protocol.py): the messages, tools and template options as `model_dump()` hands them to the chat
template, and the shapes they reject (a request-validation error, 400).

- A message is a `user` message (role and content only) or a generic one (role lower-cased, one
  of system, assistant, tool, function, developer, latest_reminder, root) with every field of
  SGLang's model, None where absent; other keys are dropped.
- Content parts keep only what the template can see: text, a media kind, a tool reference
  (thinking parts are validated, then dropped by SGLang's content processing).
- Tool calls keep id, index, type and function {name, arguments}; a tool keeps type, function
  (the client's key order, then the missing ones of description/name/parameters as None; strict
  and defer_loading only when set) and defer_loading.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from smetric_router.emulator.errors import BadRequest

Json = dict[str, Any]
GENERIC_ROLES = ("system", "assistant", "tool", "function", "developer", "latest_reminder", "root")
TOOL_HOST_ROLES = ("root", "system", "developer")  # roles whose message-level tools count
EFFORT_TIERS = ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max")
_MEDIA = {"image_url": "image_url", "video_url": "video_url", "audio_url": "audio_url"}
_OPTIONAL_STR = ("tool_call_id", "name", "reasoning_content")
_PHASES = ("commentary", "final_answer")
_FUNCTION_FIELDS = ("description", "name", "parameters", "strict", "defer_loading")


@dataclass(slots=True)
class ChatRequest:
    messages: list[Json]  # dumped messages, None-valued fields included
    tools: list[Json] | None  # the request's tools, dumped
    tool_choice: str | Json  # "auto" | "required" | "none" | {"type", "function": {"name"}}
    continue_final_message: bool = False
    reasoning_effort: str | float | None = None
    chat_template_kwargs: Json = field(default_factory=dict)

    def effective_tool_names(self) -> list[str]:
        """Request tools and message-level tools of root/system/developer messages."""
        names = [t["function"]["name"] for t in self.tools or []]
        for m in self.messages:
            if m["role"] in TOOL_HOST_ROLES and m.get("tools"):
                names += [t["function"]["name"] for t in m["tools"]]
        return names


def invalid(message: str) -> BadRequest:
    return BadRequest(message, validation=True)


def parse_chat_request(body: Json) -> ChatRequest:
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list):
        raise invalid("messages: Field required (a list)")
    messages = [dump_message(m, i) for i, m in enumerate(raw_messages)]
    raw_tools = body.get("tools")
    tools = None if raw_tools is None else _list(raw_tools, "tools", dump_tool)
    tool_choice = _tool_choice(body.get("tool_choice"), raw_tools, raw_messages)
    continue_final = body.get("continue_final_message", False)
    if not isinstance(continue_final, bool):
        raise invalid("continue_final_message: Input should be a valid boolean")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise invalid("chat_template_kwargs: Input should be a valid dictionary")
    request = ChatRequest(messages, tools, tool_choice, continue_final)
    request.chat_template_kwargs = dict(kwargs or {})
    request.reasoning_effort = _reasoning(body, request.chat_template_kwargs)
    return request


def dump_message(raw: object, i: int) -> Json:
    where = f"messages.{i}"
    if not isinstance(raw, dict):
        raise invalid(f"{where}: Input should be a valid dictionary")
    role = raw.get("role")
    if role == "user":
        if raw.get("content") is None:
            raise invalid(f"{where}.content: Field required (a string or a list of parts)")
        return {"role": "user", "content": _content(raw["content"], where, "user")}
    if not isinstance(role, str) or role.lower() not in GENERIC_ROLES:
        allowed = ", ".join(repr(r) for r in ("user", *GENERIC_ROLES))
        raise invalid(f"{where}.role: 'role' must be one of {allowed} (case-insensitive).")
    role = role.lower()
    content = raw.get("content")
    msg: Json = {"role": role, "content": None}
    if content is not None:
        msg["content"] = _content(content, where, role)
    for key in _OPTIONAL_STR:
        msg[key] = _optional(raw, key, str, where)
    phase = raw.get("phase")
    if phase is not None and phase not in _PHASES:
        raise invalid(f"{where}.phase: Input should be 'commentary' or 'final_answer'")
    msg["phase"] = phase
    calls = raw.get("tool_calls")
    msg["tool_calls"] = None if calls is None else _list(calls, f"{where}.tool_calls", _tool_call)
    tools = raw.get("tools")
    msg["tools"] = None if tools is None else _list(tools, f"{where}.tools", dump_tool)
    msg["prefix"] = _optional(raw, "prefix", bool, where)
    return msg


def _content(content: object, where: str, role: str) -> str | list[Json]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where}.content: Input should be a valid string or a list of parts")
    return [_part(p, f"{where}.content.{j}", role) for j, p in enumerate(content)]


def _part(part: object, where: str, role: str) -> Json:
    if not isinstance(part, dict):
        raise invalid(f"{where}: Input should be a valid dictionary")
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise invalid(f"{where}.text: Input should be a valid string")
        return {"type": "text", "text": part["text"]}
    if kind in ("thinking", "reasoning"):
        given = [k for k in ("thinking", "text") if part.get(k) is not None]
        if len(given) != 1 or not isinstance(part[given[0]], str):
            raise invalid(f"{where}: thinking parts require exactly one of 'thinking' or 'text'")
        if role != "assistant":
            raise invalid(f"{where}: thinking content parts are only valid in assistant messages")
        return {"type": kind}
    if kind in _MEDIA:
        ref = part.get(_MEDIA[kind])
        if not isinstance(ref, dict) or not isinstance(ref.get("url"), str):
            raise invalid(f"{where}.{kind}.url: Field required")
        return {"type": kind}
    if kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
            raise invalid(f"{where}.input_audio: needs a string 'data' and format 'wav' or 'mp3'")
        if audio.get("format") not in ("wav", "mp3"):
            raise invalid(f"{where}.input_audio: needs a string 'data' and format 'wav' or 'mp3'")
        return {"type": "audio_url"}  # SGLang turns inline audio into a data-URI audio_url part
    if kind == "tool_reference":
        if not isinstance(part.get("name"), str):
            raise invalid(f"{where}.name: Input should be a valid string")
        return {"type": "tool_reference", "name": part["name"]}
    raise invalid(f"{where}.type: unknown content part type {kind!r}")


def _tool_call(raw: object, where: str) -> Json:
    if not isinstance(raw, dict):
        raise invalid(f"{where}: Input should be a valid dictionary")
    fn = raw.get("function")
    if not isinstance(fn, dict):
        raise invalid(f"{where}.function: Field required (an object)")
    if raw.get("type", "function") != "function":
        raise invalid(f"{where}.type: Input should be 'function'")
    arguments = fn.get("arguments")
    if arguments is not None and not isinstance(arguments, str | dict):
        raise invalid(f"{where}.function.arguments: Input should be a string or an object")
    return {
        "id": _optional(raw, "id", str, where),
        "index": _optional(raw, "index", int, where),
        "type": "function",
        "function": {
            "name": _optional(fn, "name", str, f"{where}.function"),
            "arguments": arguments,
        },
    }


def dump_tool(raw: object, where: str) -> Json:
    if not isinstance(raw, dict):
        raise invalid(f"{where}: Input should be a valid dictionary")
    fn = raw.get("function")
    if not isinstance(fn, dict):
        raise invalid(f"{where}.function: Field required (an object)")
    kind = raw.get("type", "function")
    if not isinstance(kind, str):
        raise invalid(f"{where}.type: Input should be a valid string")
    if not isinstance(fn.get("name"), str):
        raise invalid(f"{where}.function.name: Field required (a string)")
    sub = f"{where}.function"
    values: Json = {
        "description": _optional(fn, "description", str, sub),
        "name": fn["name"],
        "parameters": fn.get("parameters"),
        "strict": _optional(fn, "strict", bool, sub),
        "defer_loading": _optional(fn, "defer_loading", bool, sub),
    }
    defer = _optional(raw, "defer_loading", bool, where)
    if defer is not None and values["defer_loading"] is None:
        values["defer_loading"] = defer
    for key in ("strict", "defer_loading"):
        if values[key] is None:
            del values[key]
    order = [k for k in fn if k in values] + [k for k in _FUNCTION_FIELDS if k not in fn]
    function = {k: values[k] for k in order if k in values}
    return {"type": kind, "function": function, "defer_loading": defer}


def _tool_choice(value: object, tools: object, messages: list[Any]) -> str | Json:
    if value is None:
        level = any(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and m["role"].lower() in TOOL_HOST_ROLES
            and bool(m.get("tools"))
            for m in messages
        )
        return "none" if tools is None and not level else "auto"
    if value in ("auto", "required", "none"):
        return str(value)
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        name = value["function"].get("name")
        if value.get("type", "function") == "function" and (name is None or isinstance(name, str)):
            return {"type": "function", "function": {"name": name}}
    raise invalid("tool_choice: Input should be 'auto', 'required', 'none' or a named function")


def _reasoning(body: Json, kwargs: Json) -> str | float | None:
    """reasoning_effort (or reasoning.effort), and the thinking switches SGLang derives from it
    into chat_template_kwargs (normalize_reasoning_inputs)."""
    thinking: bool | None = None
    reasoning = body.get("reasoning")
    effort = body.get("reasoning_effort")
    if isinstance(reasoning, dict):
        r_effort = reasoning.get("effort", reasoning.get("reasoning_effort"))
        if r_effort is not None:
            effort = r_effort
        enabled = reasoning.get("enabled", reasoning.get("enable", False))
        if isinstance(enabled, str):
            enabled = enabled.strip().lower() in {"1", "true", "yes", "y", "on"}
        if enabled:
            thinking = True
    if effort is not None:
        effort = _effort(effort)
        thinking = effort != "none"
    if thinking is not None:
        kwargs.setdefault("thinking", thinking)
        kwargs.setdefault("enable_thinking", thinking)
    return effort


def _effort(value: object) -> str | float:
    if isinstance(value, str) and value in EFFORT_TIERS:
        return value
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or not 0.0 <= number <= 0.99:
        raise invalid(f"reasoning_effort: invalid reasoning effort {value!r}")
    return number


def _optional(raw: Json, key: str, kind: type, where: str) -> Any:
    value = raw.get(key)
    if value is None:
        return None
    if kind is int and isinstance(value, bool):
        raise invalid(f"{where}.{key}: Input should be a valid integer")
    if not isinstance(value, kind):
        raise invalid(f"{where}.{key}: Input should be a valid {kind.__name__}")
    return value


def _list(value: object, where: str, item: Any) -> list[Json]:
    if not isinstance(value, list):
        raise invalid(f"{where}: Input should be a valid list")
    return [item(v, f"{where}.{j}") for j, v in enumerate(value)]
