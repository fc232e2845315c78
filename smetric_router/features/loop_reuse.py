"""Rendering a chat template again for a follow-up without re-running the loop iterations whose
output is already known, exactly.

A chat template spends its time in its loop over the messages, and a follow-up repeats the
previous request's messages (the same template-ready objects: chat_prompt reuses them). A loop
qualifies when its iterations cannot affect each other or anything outside them and read
nothing that changes unseen (decided from the syntax tree, `_plan`):

- it runs at most once per render (at the top level, possibly inside `{% if %}`), so its output
  is yielded chunk by chunk straight to the renderer;
- its body has no `{% break %}`, assigns no namespace attribute (nor does any macro), calls no
  clock or random source (`strftime_now`, `lipsum`, `| random`), and reads `loop` only as
  `loop.index`, `.first`, `.previtem`, `.nextitem`, `.length`... (not `cycle`/`changed`).

An iteration's output is then a function of the item, the `loop` attributes the body reads, and
the values of the names the body and the template's macros read from outside (taken when the
loop starts). The transformed template wraps the loop's sequence in a filter that takes those
values, and the body in `{% if loop is hit %}{{ loop | text }}{% else %}body{% endif %}`. When
the values are the same as in an earlier render (compared strictly: types, key order, float
spelling) and its first iterations saw the very same item objects, at the same positions, with
the same neighbours where the body reads `previtem`/`nextitem`/`last` and the same length where
it reads `length`/`revindex`, a LoopContext subclass gives the body one pseudo-iteration for that
whole run, whose output is the earlier render's text for it; the rest run as usual. Anything
else (no earlier render, other values, another template shape) renders as the template does.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import jinja2
import jinja2.nodes as n
from jinja2.runtime import LoopContext, Macro, Undefined
from jinja2.utils import Namespace

from smetric_router.features.rendered import common_prefix

_HIT = "smetric_loop_hit"
_TEXT = "smetric_loop_text"
_TRACK = "smetric_loop_track"
_RECORDER = "smetric_loop_recorder"
_LOOP_ATTRIBUTES = frozenset(
    ("index", "index0", "revindex", "revindex0", "first", "last", "length", "previtem",
     "nextitem", "depth", "depth0")
)  # fmt: skip
_READS_NEXT = frozenset(("last", "nextitem"))
_READS_LENGTH = frozenset(("length", "revindex", "revindex0"))
_IMPURE_NAMES = frozenset(("strftime_now", "lipsum"))
_IMPURE_FILTERS = frozenset(("random",))
_UNSUPPORTED = (n.Include, n.Import, n.FromImport, n.Extends, n.Block)


@dataclass(frozen=True, slots=True)
class _Plan:
    reads_next: bool  # the body reads loop.last / loop.nextitem
    reads_length: bool  # the body reads loop.length / revindex / revindex0


@dataclass(frozen=True, slots=True, eq=False)
class LoopRecord:
    """One loop of one render: the values it started with, its items, and where each
    iteration's output starts in the rendered text (one more offset: the loop's end)."""

    snapshot: tuple[Any, ...]
    items: Sequence[Any]
    offsets: array[int]


@dataclass(frozen=True, slots=True, eq=False)
class Loops:
    """The qualifying loops of one render, by their position in the template. The text is not
    kept (a prompt's text per cached request would be most of the cache): whoever reuses them
    gives it back as a Text."""

    records: dict[int, LoopRecord]

    @property
    def bytes(self) -> int:
        return sum(8 * len(r.offsets) + 8 * len(r.items) + 200 for r in self.records.values())


class Text(Protocol):
    """The text of the render that made some Loops."""

    def chars(self, start: int, end: int) -> str: ...


@dataclass(frozen=True, slots=True)
class Whole:
    """A Text held whole."""

    text: str

    def chars(self, start: int, end: int) -> str:
        return self.text[start:end]


# --- the syntax tree -------------------------------------------------------------------------


def _top_level_fors(body: list[n.Node]) -> Iterator[n.For]:
    for node in body:
        if isinstance(node, n.For):
            yield node
        elif isinstance(node, n.If):
            yield from _top_level_fors(node.body)
            for branch in node.elif_:
                yield from _top_level_fors([branch])
            yield from _top_level_fors(node.else_)


def _loop_attributes(node: n.Node, found: set[str]) -> bool:
    """Collects the attributes of the enclosing loop read under node; False where `loop` is
    used otherwise. A nested loop's body has its own `loop`."""
    if isinstance(node, n.Getattr) and isinstance(node.node, n.Name) and node.node.name == "loop":
        found.add(node.attr)
        return node.attr in _LOOP_ATTRIBUTES
    if isinstance(node, n.Name) and node.name == "loop":
        return False
    if isinstance(node, n.For):
        children: list[n.Node] = [node.iter, *node.else_]
        if node.test is not None:
            children.append(node.test)
    else:
        children = list(node.iter_child_nodes())
    return all(_loop_attributes(child, found) for child in children)


def _loads(nodes: Iterable[n.Node]) -> set[str]:
    return {name.name for node in nodes for name in node.find_all(n.Name) if name.ctx == "load"}


def _pure(nodes: Sequence[n.Node]) -> bool:
    for node in nodes:
        if any(True for _ in node.find_all((n.Break, n.NSRef))):
            return False
        if any(f.name in _IMPURE_FILTERS for f in node.find_all(n.Filter)):
            return False
    return not (_loads(nodes) & _IMPURE_NAMES)


def _macro_names(tree: n.Template) -> tuple[set[str], bool]:
    """The names the template's macros read from outside, and whether they are all pure."""
    names: set[str] = set()
    macros = list(tree.find_all(n.Macro))
    for macro in macros:
        own = {a.name for a in macro.args} | {"varargs", "kwargs", "caller"}
        names |= _loads([macro]) - own
    return names, _pure(macros) and "loop" not in names


def _plan(tree: n.Template) -> list[tuple[n.For, _Plan, list[str]]]:
    if any(True for _ in tree.find_all(_UNSUPPORTED)):
        return []
    if any(name.name == "loop" and name.ctx != "load" for name in tree.find_all(n.Name)):
        return []
    macro_names, macros_pure = _macro_names(tree)
    if not macros_pure:
        return []
    plans = []
    for loop in _top_level_fors(tree.body):
        if loop.recursive or loop.test is not None or not isinstance(loop.target, n.Name):
            continue
        attributes: set[str] = set()
        if not all(_loop_attributes(node, attributes) for node in loop.body):
            continue
        if not _pure(loop.body):
            continue
        names = (_loads(loop.body) | macro_names) - {loop.target.name, "loop"}
        plan = _Plan(bool(attributes & _READS_NEXT), bool(attributes & _READS_LENGTH))
        plans.append((loop, plan, sorted(names)))
    return plans


def _transform(tree: n.Template) -> list[_Plan]:
    """Rewrites the qualifying loops of tree in place; their plans, by position."""
    plans = []
    for index, (loop, plan, names) in enumerate(_plan(tree)):
        snapshot: list[n.Expr] = [n.Name(name, "load") for name in names]
        args: list[n.Expr] = [n.Name(_RECORDER, "load"), n.Const(index), *snapshot]
        loop.iter = n.Filter(loop.iter, _TRACK, args, [], None, None)
        hit = n.Test(n.Name("loop", "load"), _HIT, [], [], None, None)
        text = n.Output([n.Filter(n.Name("loop", "load"), _TEXT, [], [], None, None)])
        loop.body = [n.If(hit, [text], [], loop.body)]
        for node in loop.iter_child_nodes():
            node.set_lineno(loop.lineno, override=False)
        plans.append(plan)
    return plans


# --- rendering -------------------------------------------------------------------------------


def _frozen(value: Any) -> Any:
    """A value as the snapshot keeps it: macros by their code (what they read from outside is
    in the snapshot too), namespaces as a copy (later assignments change them), undefined
    values by what they say."""
    if type(value) is Macro:
        return (Macro, value._func.__code__)
    if type(value) is Namespace:
        return (Namespace, dict(value._Namespace__attrs))
    if isinstance(value, Undefined):
        hint = (value._undefined_name, value._undefined_hint, type(value._undefined_obj))
        return (type(value), hint)
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal, and rendered alike: same types, dict key order and float spelling."""
    if a is b:
        return True
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is str or kind is int or kind is bool:
        return bool(a == b)
    if kind is float:
        return repr(a) == repr(b)
    if kind is list or kind is tuple:
        return len(a) == len(b) and all(map(_same, a, b))
    if kind is dict:
        return len(a) == len(b) and all(map(_same, a.items(), b.items()))
    return False  # other objects: only themselves (code objects and functions are)


@dataclass(slots=True, eq=False)
class _Track:
    """One qualifying loop in this render."""

    index: int
    plan: _Plan
    snapshot: tuple[Any, ...]
    items: Sequence[Any]
    reused: int = 0  # leading iterations taken from the earlier render
    base: LoopRecord | None = None
    starts: list[int] = field(default_factory=list)  # chunk index at each __next__


class _Recorder:
    def __init__(self, base: Loops | None, source: Text | None, plans: list[_Plan]) -> None:
        self.base = base if source is not None else None
        self.source = source
        self.plans = plans
        self.out: list[str] = []
        # chunks that stand for a reused run ("" in out: not copied out of the earlier text)
        self.runs: dict[int, tuple[int, int]] = {}
        self.tracks: list[_Track] = []

    def track(self, index: int, items: Sequence[Any], snapshot: tuple[Any, ...]) -> _Track:
        plan = self.plans[index]
        track = _Track(index, plan, snapshot, items)
        self.tracks.append(track)
        base = self.base.records.get(index) if self.base is not None else None
        if base is None or not _same(base.snapshot, snapshot):
            return track
        known = base.items
        n_new, n_old = len(items), len(known)
        if plan.reads_length and n_new != n_old:
            return track
        same = 0
        limit = min(n_new, n_old)
        while same < limit and items[same] is known[same]:
            same += 1
        # the last of them saw a different successor unless both lists end there
        if plan.reads_next and same and not (same == n_new == n_old):
            same -= 1
        if same:
            track.reused, track.base = same, base
        return track

    def reuse(self, track: _Track) -> None:
        """The reused run's chunk is the next one."""
        base = track.base
        assert base is not None
        self.runs[len(self.out)] = (base.offsets[0], base.offsets[track.reused])

    def pieces(self) -> list[str]:
        """The rendered text's pieces (reused runs copied out)."""
        out = self.out
        if not self.runs:
            return out
        out = list(out)
        assert self.source is not None
        for i, (start, end) in self.runs.items():
            out[i] = self.source.chars(start, end)
        return out

    def shared(self, text: str) -> int:
        """Length of the common prefix of the rendered text and text, the source's text,
        without building the former: a run reused from text at its own place is equal by
        construction."""
        at = 0
        runs = self.runs
        for i, chunk in enumerate(self.out):
            run = runs.get(i)
            if run is not None:
                start, end = run
                if start == at:
                    at = end
                    continue
                chunk = text[start:end]
            if text.startswith(chunk, at):
                at += len(chunk)
            else:
                return at + common_prefix(text, chunk, at)
        return at

    def finish(self, text: str) -> Loops:
        ends = array("q", [0])
        lengths = [len(c) for c in self.out]
        for i, (start, end) in self.runs.items():
            lengths[i] = end - start
        ends.extend(itertools.accumulate(lengths))
        records = {}
        for track in self.tracks:
            offsets = array("q")
            starts = iter(track.starts)
            if track.reused and track.base is not None:
                start = ends[next(starts)]
                old = track.base.offsets
                offsets.extend(start + old[i] - old[0] for i in range(track.reused))
            offsets.extend(ends[c] for c in starts)
            records[track.index] = LoopRecord(track.snapshot, track.items, offsets)
        return Loops(records)


_PSEUDO = object()  # the item of the pseudo-iteration that stands for the reused run


class _ReusingLoop(LoopContext):
    """LoopContext; for a tracked loop, the reused run as one pseudo-iteration first."""

    _track: _Track | None = None
    _recorder: _Recorder
    reused_text: str | None = None

    def __init__(self, iterable: Any, *args: Any, **kwargs: Any) -> None:
        if type(iterable) is not _Tracked:
            super().__init__(iterable, *args, **kwargs)
            return
        super().__init__(iterable.track.items, *args, **kwargs)
        self._track = iterable.track
        self._recorder = iterable.recorder

    def __next__(self) -> tuple[Any, LoopContext]:
        track = self._track
        if track is None:
            return super().__next__()
        track.starts.append(len(self._recorder.out))  # all earlier output is taken by now
        if track.reused and self.index0 < 0:
            reused = track.reused
            self.reused_text = ""  # the chunk that stands for the run (Recorder.runs)
            self._recorder.reuse(track)
            # as if iterations 0 .. reused-1 had run: the next one sees the right index
            # and previtem
            self.index0 = reused - 1
            self._current = track.items[reused - 1]
            self._iterator = iter(track.items[reused:])
            return _PSEUDO, self
        self.reused_text = None
        return super().__next__()


@dataclass(frozen=True, slots=True)
class _Tracked:
    recorder: _Recorder
    track: _Track


def _track_filter(value: Any, recorder: Any, index: int, *snapshot: Any) -> Any:
    if type(recorder) is not _Recorder or type(value) not in (list, tuple):
        return value  # rendered without a recorder (or an odd sequence): the loop as written
    frozen = tuple(_frozen(v) for v in snapshot)
    return _Tracked(recorder, recorder.track(index, value, frozen))


def _hit_test(loop: Any) -> bool:
    return type(loop) is _ReusingLoop and loop.reused_text is not None


def _text_filter(loop: _ReusingLoop) -> str:
    return ""  # the reused run's place (Recorder.runs)


class ReusingTemplate:
    """A chat template transformed to reuse loop iterations of an earlier render."""

    def __init__(self, template: jinja2.Template, plans: list[_Plan]) -> None:
        self._template = template
        self._plans = plans
        # the compiled module's LoopContext: this template's loops are made by the subclass
        template.root_render_func.__globals__["LoopContext"] = _ReusingLoop
        # jinja keeps a template's globals as a ChainMap and walks it twice in every
        # new_context; flattened once here, a render copies a plain dict
        self._globals = dict(template.globals)

    def render(
        self, variables: dict[str, Any], base: Loops | None, source: Text | None
    ) -> tuple[str, Loops]:
        """The text, as Template.render makes it, reusing base's loops (source: base's text),
        and this render's loops for a later one."""
        recorder = self._run(variables, base, source)
        text = "".join(recorder.pieces())
        return text, recorder.finish(text)

    def shared_prefix(self, variables: dict[str, Any], base: Loops | None, text: str) -> int:
        """The length of the common prefix of the render and text, reusing the loops of the
        render that made text (base): a reused run at its own place is not compared again,
        nor is the render's text built."""
        return self._run(variables, base, Whole(text)).shared(text)

    def _run(self, variables: dict[str, Any], base: Loops | None, source: Text | None) -> _Recorder:
        recorder = _Recorder(base, source, self._plans)
        template = self._template
        context = template.environment.context_class(
            template.environment,
            {**self._globals, **variables, _RECORDER: recorder},
            template.name,
            template.blocks,
            globals=self._globals,
        )
        out = recorder.out
        try:
            for chunk in template.root_render_func(context):
                out.append(chunk)
        except Exception:
            template.environment.handle_exception()  # raises, as Template.render does
        return recorder


def reusing_template(env: jinja2.Environment, source: str) -> ReusingTemplate | None:
    """source compiled in env (a fresh one, given this module's filters) with its qualifying
    loops reusable; None if it has none."""
    tree = env.parse(source)
    plans = _transform(tree)
    if not plans:
        return None
    tree.set_environment(env)
    env.filters[_TRACK] = _track_filter
    env.filters[_TEXT] = _text_filter
    env.tests[_HIT] = _hit_test
    return ReusingTemplate(env.from_string(tree), plans)
