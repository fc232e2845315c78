"""What SGLang 0.5.23 reads off a Jinja chat template's syntax tree before rendering with it
(sglang/srt/parser/jinja_template_utils.py), decided here the same way:

- content format: "openai" when the template loops over a message's content (it renders content
  parts itself) or mentions image / audio / video / vision anywhere; else "string" (SGLang then
  joins a message's text parts with a space before rendering);
- whether it pairs tool results with tool calls by tool_call_id (SGLang then puts a run of tool
  messages carrying media into the order of the calls).
"""

from __future__ import annotations

from dataclasses import dataclass

import jinja2
import jinja2.nodes as n

from smetric_router.features.jinja_env import parse_template

STRING = "string"
OPENAI = "openai"
_MEDIA_WORDS = ("image", "audio", "video", "vision")
_CONTENT_LOOP_VARS = ("message", "msg", "m")
_ATTRIBUTE_FILTERS = ("map", "rejectattr", "selectattr")
_TOOL_CALL_ID = "tool_call_id"


@dataclass(frozen=True, slots=True)
class TemplateTraits:
    content_format: str
    pairs_tool_results_by_id: bool


def template_traits(source: str) -> TemplateTraits:
    try:
        tree: n.Template | None = parse_template(source)
    except jinja2.TemplateError:
        tree = None
    return TemplateTraits(_content_format(source, tree), _pairs_by_id(tree))


def _content_format(source: str, tree: n.Template | None) -> str:
    if any(word in source for word in _MEDIA_WORDS):
        return OPENAI
    if tree is None:
        return STRING
    for loop in tree.find_all(n.For):
        if any(_reads(loop.iter, var, "content") for var in _CONTENT_LOOP_VARS):
            return OPENAI
    return STRING


def _reads(node: n.Node, var: str, key: str) -> bool:
    """node is var[key] / var.key, possibly under filters, tests or a slice."""
    if isinstance(node, n.Filter):
        return node.node is not None and _reads(node.node, var, key)
    if isinstance(node, n.Test):
        return _reads(node.node, var, key)
    if isinstance(node, n.Getitem) and isinstance(node.arg, n.Slice):
        return _reads(node.node, var, key)
    if isinstance(node, n.Getitem):
        return _is_name(node.node, var) and isinstance(node.arg, n.Const) and node.arg.value == key
    if isinstance(node, n.Getattr):
        return _is_name(node.node, var) and node.attr == key
    return False


def _is_name(node: n.Node, var: str) -> bool:
    return isinstance(node, n.Name) and node.ctx == "load" and node.name == var


def _is_tool_call_id(node: n.Node) -> bool:
    return isinstance(node, n.Const) and node.value == _TOOL_CALL_ID


def _pairs_by_id(tree: n.Template | None) -> bool:
    if tree is None:
        return False
    if any(g.attr == _TOOL_CALL_ID for g in tree.find_all(n.Getattr)):
        return True
    if any(_is_tool_call_id(g.arg) for g in tree.find_all(n.Getitem)):
        return True
    for call in tree.find_all(n.Call):
        if (
            isinstance(call.node, n.Getattr)
            and call.node.attr == "get"
            and call.args
            and _is_tool_call_id(call.args[0])
        ):
            return True
    for f in tree.find_all(n.Filter):
        if f.name not in _ATTRIBUTE_FILTERS:
            continue
        if f.args and _is_tool_call_id(f.args[0]):
            return True
        if any(k.key == "attribute" and _is_tool_call_id(k.value) for k in f.kwargs):
            return True
    return False
