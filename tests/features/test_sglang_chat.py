"""Chat requests turned into what SGLang 0.5.23 hands its template (the golden test checks the
whole against SGLang itself; these name the rules one by one)."""

from __future__ import annotations

from typing import Any

import pytest

from smetric_router.features.errors import FeatureError
from smetric_router.features.sglang_chat import (
    final_turn,
    request_tools,
    template_kwargs,
    template_message,
    tool_dump,
    tool_result_order,
)
from smetric_router.features.template_traits import OPENAI, STRING

PARTS = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}},
         {"type": "text", "text": "b"}]  # fmt: skip


def test_user_messages_keep_role_and_content_only() -> None:
    message = {"role": "user", "content": "hi", "name": "bob", "tool_calls": []}
    assert template_message(message, 0, STRING) == {"role": "user", "content": "hi"}


def test_other_roles_keep_their_fields_lower_cased_without_nulls() -> None:
    message = {"role": "Assistant", "content": None, "name": None, "reasoning_content": "r",
               "extra": 1}  # fmt: skip
    assert template_message(message, 0, STRING) == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "r",
    }


def test_tool_calls_are_dumped_with_parsed_arguments() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": [1]}'}}
    out = template_message({"role": "assistant", "content": "", "tool_calls": [call]}, 0, STRING)
    assert out["tool_calls"] == [
        {"id": "c", "index": None, "type": "function",
         "function": {"name": "f", "arguments": {"x": [1]}}},
    ]  # fmt: skip
    # only an assistant's tool calls are parsed
    other = template_message({"role": "tool", "content": "", "tool_calls": [call]}, 0, STRING)
    assert other["tool_calls"][0]["function"]["arguments"] == '{"x": [1]}'


@pytest.mark.parametrize(
    ("arguments", "error"), [("{", "valid JSON"), ("[1]", "a JSON object"), ("3", "a JSON object")]
)
def test_bad_tool_call_arguments_are_the_clients_error(arguments: str, error: str) -> None:
    call = {"function": {"name": "f", "arguments": arguments}}
    with pytest.raises(FeatureError, match=error):
        template_message({"role": "assistant", "tool_calls": [call]}, 0, STRING)


def test_content_parts_by_template_format() -> None:
    assert template_message({"role": "user", "content": PARTS}, 0, STRING)["content"] == "a b"
    assert template_message({"role": "user", "content": PARTS}, 0, OPENAI)["content"] == [
        {"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"},
    ]  # fmt: skip
    # a tool message's all-text parts are joined for "openai" templates too; its content last
    tool = {"role": "tool", "content": [PARTS[0], PARTS[2]], "tool_call_id": "c"}
    assert list(template_message(tool, 0, OPENAI).items()) == [
        ("role", "tool"), ("tool_call_id", "c"), ("content", "a b"),
    ]  # fmt: skip


def test_final_assistant_turn() -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "half"}]
    assert final_turn(messages, False) == ([messages[0], {"role": "user", "content": "half"}], None)
    assert final_turn(messages, True) == ([messages[0]], "half")
    parts: list[dict[str, Any]] = [messages[0], {"role": "assistant", "content": []}]
    assert final_turn(parts, False) == (parts, None)


def test_tools_are_dumped_in_the_clients_key_order() -> None:
    tool = {"function": {"parameters": {}, "name": "f", "unknown": 1}, "extra": 2}
    assert tool_dump(tool) == {
        "type": "function",
        "function": {"parameters": {}, "name": "f", "description": None},
        "defer_loading": None,
    }
    strict = {"type": "function", "function": {"name": "f", "strict": True}, "defer_loading": True}
    assert tool_dump(strict)["function"] == {
        "name": "f", "strict": True, "description": None, "parameters": None, "defer_loading": True,
    }  # fmt: skip


def test_which_tools_the_template_gets() -> None:
    tools: list[Any] = [{"type": "function", "function": {"name": n}} for n in ("a", "b")]

    def names(out: list[dict[str, Any]] | None) -> list[str]:
        return [t["function"]["name"] for t in out or []]

    assert names(request_tools({"tools": tools}, False)) == ["a", "b"]
    assert request_tools({"tools": tools, "tool_choice": "none"}, False) is None
    assert request_tools({"tools": []}, False) is None
    assert request_tools({}, False) is None
    named = {"type": "function", "function": {"name": "b"}}
    assert names(request_tools({"tools": tools, "tool_choice": named}, False)) == ["b"]
    missing = {"type": "function", "function": {"name": "zz"}}
    assert request_tools({"tools": tools, "tool_choice": missing}, False) is None
    with pytest.raises(FeatureError, match="'tools'"):
        request_tools({"tools": {"a": 1}}, False)


def test_template_kwargs() -> None:
    assert template_kwargs({}) == {}
    assert template_kwargs({"chat_template_kwargs": {"enable_thinking": False}}) == {
        "enable_thinking": False
    }
    assert template_kwargs({"reasoning_effort": "none"}) == {
        "reasoning_effort": "none", "thinking": False, "enable_thinking": False,
    }  # fmt: skip
    assert template_kwargs(
        {"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False}}
    ) == {"reasoning_effort": "low", "thinking": True, "enable_thinking": False}
    assert template_kwargs({"reasoning": {"enabled": "yes"}}) == {
        "thinking": True, "enable_thinking": True,
    }  # fmt: skip


def test_tool_results_with_media_follow_their_calls_order() -> None:
    calls = [{"id": i, "function": {"name": "f"}} for i in ("x", "y")]
    image = [{"type": "image_url", "image_url": {"url": "u"}}]
    messages: list[Any] = [
        {"role": "assistant", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "y", "content": image},
        {"role": "tool", "tool_call_id": "x", "content": "text"},
    ]
    assert tool_result_order(messages) == [0, 2, 1]
    messages[1]["content"] = "text"  # text-only runs keep the request's order
    assert tool_result_order(messages) is None
