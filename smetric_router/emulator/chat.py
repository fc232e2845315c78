"""A chat request's prompt ids, made as SGLang 0.5.23 makes them for a Jinja chat template
(sglang/srt/entrypoints/openai/serving_chat.py: _validate_request, _process_messages,
_apply_jinja_template, _render_and_encode_chat_template):

1. the request's messages and tools as its pydantic models dump them (emulator.chat_request);
2. assistant tool-call `arguments` given as JSON strings parsed into objects (a string that is
   not a JSON object fails the request);
3. per message: null content becomes "", fields that are None are dropped, list content is
   processed for the template's content format, a tool message's text parts are joined;
4. a trailing assistant message with text content becomes a user message, or with
   `continue_final_message` is cut off and its text appended to the prompt ids;
5. `tools` (unless tool_choice is "none"; only the named one for a named choice), the request's
   reasoning_effort and chat_template_kwargs go to the template; the tokenizer renders the whole
   conversation with `apply_chat_template(..., add_generation_prompt=True)` and encodes the
   string as one (no special tokens added where the tokenizer would add some).

Not emulated: SGLang's conversation (non-Jinja) and Python chat templates, model-specific
encoders (DeepSeek V3.2/V4, Kimi K3, MiniMax M3, GPT-OSS), tool results reordered around media,
DB-style type aliases rewritten in tool schemas, JSON-schema validation of tool parameters. The
emulated model is text-only: image, video and audio parts are refused, as SGLang refuses them for
a text-only model.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jinja2
import orjson

from smetric_router.emulator.chat_request import ChatRequest, Json, parse_chat_request
from smetric_router.emulator.chat_template import ContentFormat
from smetric_router.emulator.errors import BadRequest, InternalError
from smetric_router.emulator.tokenizer import WorkerTokenizer

_MEDIA_KINDS = {"image_url": "image", "video_url": "video", "audio_url": "audio"}


def chat_prompt_ids(tok: WorkerTokenizer, body: Json) -> list[int]:
    """The prompt ids SGLang would compute for this /v1/chat/completions body. Raises BadRequest
    (400) for what SGLang refuses, InternalError (500) where its template fails unexpectedly."""
    request = parse_chat_request(body)
    if not request.messages:
        raise BadRequest("Messages cannot be empty.")
    _validate(request)
    for message in request.messages:
        _parse_tool_call_arguments(message)
    fmt = tok.template.content_format
    messages = [_for_template(m, fmt) for m in copy.deepcopy(request.messages)]
    messages, prefix = _last_assistant(messages, request.continue_final_message)
    kwargs: Json = {}
    if request.reasoning_effort is not None:
        kwargs["reasoning_effort"] = request.reasoning_effort
    kwargs.update(request.chat_template_kwargs)
    ids = _render_ids(tok, messages, _template_tools(request), kwargs)
    if prefix:
        encoded = list(tok.hf.encode(prefix))
        if encoded and encoded[0] == tok.hf.bos_token_id:
            encoded = encoded[1:]
        ids += encoded
    return ids


def _validate(request: ChatRequest) -> None:
    """The checks of SGLang's _validate_request that concern rendering."""
    if "chat_template" in request.chat_template_kwargs:
        raise BadRequest(
            "Request-supplied chat_template is not allowed. Start the server with "
            "--trust-request-chat-template to permit it."
        )
    media = (
        part["type"]
        for m in request.messages
        if isinstance(m["content"], list)
        for part in m["content"]
        if part["type"] in _MEDIA_KINDS
    )
    kind = next(media, None)
    if kind is not None:  # the emulated model (Qwen3-Coder) is text-only
        raise BadRequest(
            f"Model only supports text input; received unsupported content type '{kind}'."
        )
    names = request.effective_tool_names()
    choice = request.tool_choice
    if isinstance(choice, str):
        if choice == "required" and not names:
            raise BadRequest("Tools cannot be empty if tool choice is set to required.")
    else:
        if not names:
            raise BadRequest("Tools cannot be empty if tool choice is set to a specific tool.")
        name = choice["function"]["name"]
        if name not in names:
            raise BadRequest(f"Tool '{name}' not found in tools list.")
    has_message_tools = any(
        m["role"] in ("root", "system", "developer") and m.get("tools") for m in request.messages
    )
    if has_message_tools and len(names) != len(set(names)):
        raise BadRequest("Tool names must be unique across request and message tools.")


def _parse_tool_call_arguments(message: Json) -> None:
    """normalize_assistant_tool_call_arguments (strict): an assistant's JSON-string arguments
    become the object they encode."""
    calls = message.get("tool_calls")
    if message["role"] != "assistant" or not isinstance(calls, list):
        return
    for call in calls:
        function = call["function"]
        if isinstance(function.get("arguments"), str):
            try:
                parsed = orjson.loads(function["arguments"])
            except orjson.JSONDecodeError as exc:
                raise BadRequest(
                    "Assistant tool call function.arguments must be valid JSON."
                ) from exc
            if not isinstance(parsed, dict):
                raise BadRequest("Assistant tool call function.arguments must be a JSON object.")
            function["arguments"] = parsed


def _for_template(message: Json, fmt: ContentFormat) -> Json:
    """process_content_for_template_format, then normalize_tool_content."""
    if message.get("content") is None:
        message["content"] = ""
    content = message["content"]
    if not isinstance(content, list):
        out = {k: v for k, v in message.items() if v is not None}
    elif fmt == "openai":
        out = {k: v for k, v in message.items() if v is not None and k != "content"}
        out["content"] = [p for p in (_openai_part(part) for part in content) if p is not None]
    else:
        texts = [part["text"] for part in content if part["type"] == "text"]
        out = {k: v for k, v in {**message, "content": " ".join(texts)}.items() if v is not None}
    parts = out["content"]
    texts_only = isinstance(parts, list) and all(p["type"] == "text" for p in parts)
    if out["role"] == "tool" and texts_only:
        out["content"] = " ".join(p.get("text", "") for p in parts)
    return out


def _openai_part(part: Json) -> Json | None:
    kind = part["type"]
    if kind in _MEDIA_KINDS:
        return {"type": _MEDIA_KINDS[kind]}
    if kind == "text":
        return {"type": "text", "text": part["text"]}
    if kind == "tool_reference":
        return part
    return None  # thinking parts do not reach the template


def _last_assistant(messages: list[Json], continue_final: bool) -> tuple[list[Json], str | None]:
    """_handle_last_assistant_message: a trailing assistant message with text content is either
    the prefix to continue (continue_final_message) or re-rolled as a user message."""
    if messages and messages[-1].get("role") == "assistant":
        content = messages[-1].get("content")
        if isinstance(content, str):
            if continue_final:
                return messages[:-1], content
            return [*messages[:-1], {"role": "user", "content": content}], None
    return messages, None


def _template_tools(request: ChatRequest) -> list[Json] | None:
    choice = request.tool_choice
    if not request.effective_tool_names() or choice == "none":
        return None
    if not isinstance(choice, str):
        name = choice["function"]["name"]
        return [t for t in request.tools or [] if t["function"]["name"] == name] or None
    return request.tools or None


def _render_ids(
    tok: WorkerTokenizer, messages: list[Json], tools: list[Json] | None, kwargs: Json
) -> list[int]:
    """Render with the tools as given; on any failure once more with function-only tools (the
    flat form some templates expect); a template error or TypeError then is a 400, a ValueError
    too (SGLang's handler), anything else a 500."""
    try:
        return _render(tok, messages, tools, kwargs)
    except Exception:
        flat = [t.get("function", t) for t in tools] if tools else None
    try:
        return _render(tok, messages, flat, kwargs)
    except (jinja2.TemplateError, TypeError, ValueError) as exc:
        raise BadRequest(str(exc)) from exc
    except Exception as exc:
        raise InternalError(str(exc)) from exc


def _render(
    tok: WorkerTokenizer, messages: list[Json], tools: list[Json] | None, kwargs: Json
) -> list[int]:
    hf = tok.hf
    schemas: list[dict[Any, Any] | Callable[..., Any]] | None = None if tools is None else [*tools]
    if tok.round_trip_lossy:  # encode straight to ids: text would lose control tokens
        ids: Any = hf.apply_chat_template(
            messages,
            tokenize=True,
            add_generation_prompt=True,
            tools=schemas,
            return_dict=False,
            **kwargs,
        )
        return [int(i) for i in ids]
    rendered = hf.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=True,
        tools=schemas,
        return_dict=False,
        **kwargs,
    )
    encode_kwargs = {"add_special_tokens": False} if tok.auto_adds_specials else {}
    return [int(i) for i in hf.encode(rendered, **encode_kwargs)]
