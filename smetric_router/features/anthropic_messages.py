"""An Anthropic Messages request body (/v1/messages, /v1/messages/count_tokens) turned into the
OpenAI chat body SGLang 0.5.23 builds from it (entrypoints/anthropic/serving.py converts every
Messages request to a chat completion and renders that with the chat template), so the router
renders, tokenizes and hashes it through the chat path and gets SGLang's page hashes.

What SGLang does, for a worker without a reasoning parser or Python chat encoder (the workers
this project launches; the tiny model and Qwen3-Coder's Jinja template):

- `system` (a string kept whole when not blank, or the non-empty text blocks) and, when the
  template drops a system message in mid-conversation, the stripped text of `role: "system"`
  messages, joined by newlines into one leading system message;
- a message with string content stays as it is; block content becomes parts: text blocks (also
  empty ones), images as image_url parts, search results as text; `tool_use` blocks become the
  assistant's tool_calls (arguments as Python's json.dumps writes them); a user's `tool_result`
  becomes tool messages (one per run of references / other parts) after the user text before
  it, an assistant's a "Tool result: ..." text part; one text part collapses to a string;
- `thinking` blocks of earlier assistant turns are dropped (no reasoning parser to rewrap them);
  `redacted_thinking` is refused;
- custom tools become function tools (`input_schema` gains "type": "object" when it has no
  type; a missing description is ""), server tools (web_search_*, bash_*, ...) are skipped;
  tool_choice none/auto/any/tool maps to none/auto/required/the named function;
- output_config.effort becomes reasoning_effort (xhigh as max).

Not reproduced: a reasoning `thinking` (`enabled`, `adaptive`: SGLang refuses it without a
reasoning parser and switches the template with one; the router forwards the body without it to
workers that have none, features/anthropic_thinking.py), multimodal processing.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from smetric_router.features.errors import FeatureError

Part = dict[str, Any]
_ROLES = ("user", "assistant", "system")
_SERVER_TOOLS = {
    "web_search_": r"web_search_\d{8}",
    "computer_": r"computer_\d{8}",
    "bash_": r"bash_\d{8}",
    "text_editor_": r"text_editor_\d{8}",
}
_EFFORTS = ("minimal", "low", "medium", "high", "xhigh", "max")
_SENTINEL = "__smetric_inline_system_sentinel__"


def chat_body(body: Mapping[str, Any], inline_system: bool) -> dict[str, Any]:
    """The chat completion body SGLang renders for this Messages body. inline_system: whether
    the chat template renders a system message in mid-conversation (supports_inline_system)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise FeatureError("model: Field required (a non-empty string).")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list):
        raise FeatureError("messages: Field required (an array of messages).")
    messages = [_message(m, i) for i, m in enumerate(raw_messages)]
    out: list[dict[str, Any]] = []
    system = _system(body.get("system"))
    if not inline_system:
        system += [t for role, c in messages if role == "system" if (t := _system_text(c))]
    if system:
        out.append({"role": "system", "content": "\n".join(system)})
    for role, content in messages:
        if role == "system" and not inline_system:
            continue
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        else:
            _blocks(role, content, out)
    chat: dict[str, Any] = {"model": model, "messages": out}
    if "max_tokens" in body:
        chat["max_tokens"] = body["max_tokens"]
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    choice = _tool_choice(body.get("tool_choice"), tools)
    if choice is not None:
        chat["tool_choice"] = choice
    effort = _effort(body.get("output_config"))
    if effort is not None:
        chat["reasoning_effort"] = effort
    return chat


def supports_inline_system(template: str) -> bool:
    """Whether the template renders a system message after the first turn (SGLang's probe:
    a second system message's text must appear in the rendering; a failing render is no)."""
    return _inline_system(template)


@functools.lru_cache(maxsize=8)
def _inline_system(template: str) -> bool:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    probe = [
        {"role": "system", "content": "t"},
        {"role": "user", "content": "t"},
        {"role": "system", "content": _SENTINEL},
        {"role": "user", "content": "t"},
    ]
    try:
        return _SENTINEL in env.from_string(template).render(
            messages=probe, add_generation_prompt=False
        )
    except Exception:  # a template that refuses the probe cannot take it inline
        return False


# -- messages -------------------------------------------------------------------------------


def _message(message: object, index: int) -> tuple[str, str | list[Part]]:
    if not isinstance(message, dict):
        raise FeatureError(f"messages.{index}: Input should be an object.")
    role = message.get("role")
    if role not in _ROLES:
        raise FeatureError(f"messages.{index}.role: Input should be 'user', 'assistant', 'system'.")
    content = message.get("content")
    if isinstance(content, str):
        return role, content
    if not isinstance(content, list):
        raise FeatureError(f"messages.{index}.content: Input should be a string or a block list.")
    return role, [_block(b, f"messages.{index}.content.{k}") for k, b in enumerate(content)]


def _block(block: object, where: str) -> Part:
    """A content block checked as SGLang's pydantic models check it (the fields read here)."""
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise FeatureError(f"{where}: each content block needs a string 'type'.")
    kind = block["type"]
    required = {"text": ("text",), "tool_use": ("id", "name"), "thinking": ("thinking",)}
    for field in required.get(kind, ()):
        if not isinstance(block.get(field), str):
            raise FeatureError(f"{where}.{kind}.{field}: Field required (a string).")
    if kind == "tool_use" and not isinstance(block.get("input", {}), dict):
        raise FeatureError(f"{where}.tool_use.input: Input should be an object.")
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list):
            inner = [_block(b, f"{where}.tool_result.content.{k}") for k, b in enumerate(content)]
            block = {**block, "content": inner}
    elif kind not in (
        "text", "image", "tool_use", "tool_reference", "search_result", "thinking",
        "redacted_thinking",
    ):  # fmt: skip
        raise FeatureError(f"{where}: unknown content block type {kind!r}.")
    return block


def _system(system: object) -> list[str]:
    if system is None:
        return []
    if isinstance(system, str):
        return [system] if system.strip() else []
    if not isinstance(system, list):
        raise FeatureError("system: Input should be a string or a list of blocks.")
    blocks = [_block(b, f"system.{k}") for k, b in enumerate(system)]
    return [b["text"] for b in blocks if b["type"] == "text" and b["text"]]


def _system_text(content: str | list[Part]) -> str | None:
    if isinstance(content, str):
        return content.strip() or None
    texts = [b["text"].strip() for b in content if b["type"] == "text"]
    return "\n".join(t for t in texts if t) or None


def _blocks(role: str, blocks: list[Part], out: list[dict[str, Any]]) -> None:
    message: dict[str, Any] = {"role": role}
    parts: list[Part] = []
    calls: list[dict[str, Any]] = []
    if role == "assistant" and any(b["type"] == "redacted_thinking" for b in blocks):
        raise FeatureError("Anthropic redacted_thinking history is not supported")
    for block in blocks:
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and block.get("source"):
            image = _image(block["source"])
            if image is not None:
                parts.append(image)
        elif kind == "search_result":
            text = _search_text(block)
            if text:
                parts.append({"type": "text", "text": text})
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block["id"] or "call_",  # SGLang makes up a random id: no cache anyway
                    "type": "function",
                    "function": {
                        "name": block["name"],
                        "arguments": _json_dumps(block.get("input") or {}),
                    },
                }
            )
        elif kind == "tool_result":
            contents, text = _tool_result(block.get("content"))
            if role == "user":
                _flush_user(parts, out)
                call_id = block.get("tool_use_id") or block.get("id") or ""
                out.extend({"role": "tool", "tool_call_id": call_id, "content": c}
                           for c in contents)  # fmt: skip
            else:
                parts.append({"type": "text", "text": f"Tool result: {text}"})
    if calls:
        message["tool_calls"] = calls
    if parts:
        only_text = len(parts) == 1 and parts[0]["type"] == "text"
        message["content"] = parts[0]["text"] if only_text else parts
        out.append(message)
    elif calls:
        out.append(message)
    elif role != "user":
        message["content"] = ""
        out.append(message)


def _flush_user(parts: list[Part], out: list[dict[str, Any]]) -> None:
    if not parts:
        return
    only_text = len(parts) == 1 and parts[0]["type"] == "text"
    out.append({"role": "user", "content": parts[0]["text"] if only_text else list(parts)})
    parts.clear()


def _image(source: object) -> Part | None:
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64":
        data = source.get("data", "")
        if not data:
            return None
        media = source.get("media_type", "image/png")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    url = source.get("url")
    return {"type": "image_url", "image_url": {"url": url}} if url else None


def _search_text(item: Mapping[str, Any]) -> str:
    lines = []
    if item.get("title"):
        lines.append(f"Title: {item['title']}")
    source = item.get("source")
    if isinstance(source, dict):
        where = source.get("url") or source.get("text")
        if where:
            lines.append(f"Source: {where}")
    elif source:
        lines.append(f"Source: {source}")
    content = item.get("content")
    texts: list[str] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        texts += [p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text"
                  and p.get("text")]  # fmt: skip
    if texts:
        lines.append("Content: " + "\n".join(texts))
    return "\n".join(lines)


def _tool_result(content: object) -> tuple[list[str | list[Part]], str]:
    """(the tool messages' contents, the result's text)."""
    if not isinstance(content, list):
        text = _py_str(content) if content else ""
        return [text], text
    parts: list[Part] = []
    texts: list[str] = []
    for item in content:
        kind = item["type"]
        if kind == "text" and item["text"]:
            texts.append(item["text"])
            parts.append({"type": "text", "text": item["text"]})
        elif kind == "image":
            image = _image(item.get("source"))
            if image is not None:
                parts.append(image)
        elif kind == "tool_reference":
            name = item.get("tool_name") or item.get("name")
            if name:
                parts.append({"type": "tool_reference", "name": name})
        elif kind == "search_result":
            text = _search_text(item)
            if text:
                texts.append(text)
                parts.append({"type": "text", "text": text})
    # a run of tool references is a tool message of its own (GLM templates expand them first)
    groups: list[list[Part]] = []
    for part in parts:
        reference = part["type"] == "tool_reference"
        if not groups or (groups[-1][0]["type"] == "tool_reference") != reference:
            groups.append([])
        groups[-1].append(part)
    contents: list[str | list[Part]] = [
        g[0]["text"] if len(g) == 1 and g[0]["type"] == "text" else g for g in groups
    ]
    return contents or [""], "\n".join(texts)


def _py_str(value: object) -> str:
    # str() of what pydantic kept: a non-list content is a string by SGLang's schema
    if isinstance(value, str):
        return value
    raise FeatureError("tool_result.content: Input should be a string or a list of blocks.")


def _json_dumps(value: object) -> str:
    """Python's json.dumps(value) (", " and ": " separators, non-ASCII escaped), as SGLang."""
    return json.dumps(value)


# -- tools ----------------------------------------------------------------------------------


def _tools(tools: object) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise FeatureError("tools: Input should be a list.")
    out = []
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise FeatureError(f"tools.{k}: Input should be an object.")
        kind = tool.get("type")
        if kind is not None and not isinstance(kind, str):
            raise FeatureError(f"tools.{k}.type: Input should be a string.")
        server = next((p for p in _SERVER_TOOLS if kind and kind.startswith(p)), None)
        if server is not None:
            if not re.fullmatch(_SERVER_TOOLS[server], kind or ""):
                raise FeatureError(f"tools.{k}.type: unknown server tool type {kind!r}.")
            continue  # Anthropic's own server tools: SGLang has nothing to run them with
        if kind not in (None, "custom"):
            raise FeatureError(f"tools.{k}.type: Input should be 'custom'.")
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not isinstance(schema, dict):
            raise FeatureError(f"tools.{k}: a custom tool needs a 'name' and an 'input_schema'.")
        if "type" not in schema:
            schema = {**schema, "type": "object"}
        out.append(
            {
                "type": "function",
                "defer_loading": tool.get("defer_loading"),
                "function": {
                    "name": name,
                    "description": tool.get("description") or "",
                    "parameters": schema,
                    "strict": bool(tool.get("strict", False)),
                },
            }
        )
    return out


def _tool_choice(choice: object, tools: list[dict[str, Any]]) -> object:
    if choice is None:
        return "auto" if tools else None
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise FeatureError("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'.")
    kind = choice["type"]
    if kind == "none":
        return "none"
    if not tools:
        if kind in ("any", "tool"):
            raise FeatureError(
                f"tool_choice={kind!r} requires at least one custom tool; all supplied tools "
                "were server-side Anthropic built-ins which the OpenAI-compatible backend "
                "cannot invoke"
            )
        return None
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    name = choice.get("name")
    if not any(t["function"]["name"] == name for t in tools):
        raise FeatureError(
            f"tool_choice references tool {name!r} but it is not in the forwarded tools list "
            "(server-side Anthropic tools cannot be selected)"
        )
    return {"type": "function", "function": {"name": name}}


def _effort(config: object) -> str | None:
    if not isinstance(config, dict):
        return None
    effort = config.get("effort")
    if effort is None:
        return None
    if effort not in _EFFORTS:
        raise FeatureError(f"output_config.effort: Input should be one of {', '.join(_EFFORTS)}.")
    return "max" if effort == "xhigh" else str(effort)
