"""Compiling a chat template in a Jinja environment set up as transformers 5.19 sets up its own
(transformers/utils/chat_template_utils.py, what SGLang 0.5.23 renders chats with):

- an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks;
- the loopcontrols extension ({% break %}, {% continue %}) and a {% generation %} block tag
  that renders its body unchanged (transformers tracks its span only for assistant masks);
- a `tojson` filter that is plain json.dumps (no HTML escaping; ensure_ascii=False by default,
  indent / separators / sort_keys passed through);
- globals `raise_exception(message)` (a TemplateError) and `strftime_now(format)` (local time).

Shortcuts give the sandbox's own answers faster (rendering is per request, so it counts): its
verdict on an attribute depends only on the object's type and the attribute's name, so it is
kept per (type, name); `message.role` on a plain dict, which the sandbox answers by failing
getattr and then indexing, indexes directly when the name is not a dict attribute, and
`message['tool_calls']` missing from one is undefined without trying getattr; str.format
wrapping is asked only about methods; a macro is called as Context.call and Macro.__call__
would, skipping their argument handling when there is none to do (Jinja 3.1.6; tested against
Jinja's own sandbox).
"""

from __future__ import annotations

import functools
import json
import types
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.runtime import Context, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment

from smetric_router.features.loop_reuse import ReusingTemplate, reusing_template


class GenerationBlock(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: the body, rendered as if the tags were absent."""

    tags = {"generation"}  # noqa: RUF012 (jinja2.ext.Extension declares it a class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> Any:
        return caller()


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_DICT_ATTRIBUTES = frozenset(dir(dict))


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' ImmutableSandboxedEnvironment, answering the same, faster."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._verdicts: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        key = (type(obj), attr)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._verdicts[key] = bool(super().is_safe_attribute(obj, attr, value))
        return verdict

    def getitem(self, obj: Any, argument: Any) -> Any:
        try:
            return obj[argument]
        except (TypeError, LookupError):
            if type(obj) is dict and type(argument) is str and argument not in _DICT_ATTRIBUTES:
                # `message['tool_calls'] is defined`: a plain dict has no such attribute either
                return self.undefined(obj=obj, name=argument)
        return super().getitem(obj, argument)  # indexes again: template data has no side effects

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        # the sandbox's getattr, asking wrap_str_format only about methods (all it wraps)
        try:
            value = getattr(obj, attribute)
        except AttributeError:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)
        if type(value) is types.MethodType or type(value) is types.BuiltinMethodType:
            wrapped = self.wrap_str_format(value)
            if wrapped is not None:
                return wrapped
        if self.is_safe_attribute(obj, attribute, value):
            return value
        return self.unsafe_undefined(obj, attribute)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        """A macro called as Context.call calls it; given just its parameters, positionally
        (no caller, varargs, keywords or autoescaping), its body called as Macro.__call__
        would call it."""
        if type(__obj) is not Macro or not __self.is_safe_callable(__obj):
            return super().call(__context, __obj, *args, **kwargs)
        kwargs.pop("_block_vars", None)
        kwargs.pop("_loop_vars", None)
        try:
            if (
                not kwargs
                and len(args) == __obj._argument_count
                and not (__obj.caller or __obj.catch_kwargs or __obj.catch_varargs)
                and not (__context.eval_ctx.autoescape or __self.is_async)
            ):
                return __obj._func(*args)
            return __obj(__context.eval_ctx, *args, **kwargs)
        except StopIteration:
            return __self.undefined(
                "value was undefined because a callable raised a StopIteration exception"
            )


def make_environment() -> ImmutableSandboxedEnvironment:
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template (one environment per template, as transformers caches them)."""
    return make_environment().from_string(source)


@functools.lru_cache(maxsize=16)
def compile_reusing(source: str) -> ReusingTemplate | None:
    """The template transformed to reuse an earlier render's loop iterations (loop_reuse), in
    an environment of its own; None when no loop of it qualifies."""
    return reusing_template(make_environment(), source)


def parse_template(source: str) -> jinja2.nodes.Template:
    """The template's syntax tree, parsed by the same environment."""
    return compile_template(source).environment.parse(source)
