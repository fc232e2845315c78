"""Label selectors as the flags give them: `key=value` items (each flag value may hold several,
comma-separated), all of which a pod must carry. Only equality is taken: a set-based or
negated expression would be read by the API server and by this router differently if either got
it wrong, so it is refused instead of half-supported."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Kubernetes' label syntax: an optional DNS-subdomain prefix and '/', then a name of at most 63
# characters; values are empty or a name.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_KEY_RE = re.compile(rf"({_PREFIX}/)?{_NAME}")
_VALUE_RE = re.compile(rf"({_NAME})?")


class SelectorError(ValueError):
    """A selector item is not `key=value` with a valid label key and value."""


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """Pairs a pod's labels must all carry; empty matches every pod."""

    pairs: tuple[tuple[str, str], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.pairs)

    def query(self) -> str:
        """The API server's labelSelector parameter."""
        return ",".join(f"{k}={v}" for k, v in self.pairs)

    def __bool__(self) -> bool:
        return bool(self.pairs)

    def __str__(self) -> str:
        return self.query() or "(any)"


def parse_selector(items: Iterable[str], flag: str = "--selector") -> LabelSelector:
    """`key=value` items -> a selector; a malformed one raises SelectorError naming the flag."""
    pairs: dict[str, str] = {}
    for item in items:
        for part in item.split(","):
            key, sep, value = part.strip().partition("=")
            if not sep or value.startswith("=") or key.endswith("!"):
                raise SelectorError(f"{flag} takes key=value items, got {part.strip()!r}")
            if len(key.partition("/")[0]) > 253 or not _KEY_RE.fullmatch(key):
                raise SelectorError(f"{flag}: {key!r} is not a valid label key")
            if not _VALUE_RE.fullmatch(value):
                raise SelectorError(f"{flag}: {value!r} is not a valid label value (for {key})")
            if pairs.get(key, value) != value:
                raise SelectorError(f"{flag}: {key} given twice, as {pairs[key]!r} and {value!r}")
            pairs[key] = value
    return LabelSelector(tuple(sorted(pairs.items())))


def common(*selectors: LabelSelector) -> LabelSelector:
    """The pairs every selector has: what the API server can filter on for all of them."""
    if not selectors:
        return LabelSelector()
    shared = set(selectors[0].pairs).intersection(*(s.pairs for s in selectors[1:]))
    return LabelSelector(tuple(sorted(shared)))
