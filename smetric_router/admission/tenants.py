"""Tenants: the API keys of --api-key-file, each with a name, rate limits, a weight in the
admission queue and a priority cap (docs/admission.md#tenants-and-priorities).

The file is YAML or JSON (YAML reads both), decoded strictly: unknown fields, wrong types and
out-of-range values are start-up errors naming the field's path; so are duplicate names or keys.

    tenants:
      - name: team-a
        key_env: TEAM_A_KEY          # or key: "..." (the file is then a secret itself)
        requests_per_minute: 600     # optional
        tokens_per_minute: 2000000   # optional: prompt tokens as the router counts them
        weight: 3                    # default 1
        max_priority: 10             # optional: the highest `priority` its requests may ask

Keys never appear in a message, a log line or a repr; names do (they label the metrics and the
x-smetric-tenant header, so their number is the file's).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import msgspec
import yaml

from smetric_router.admission.buckets import Limits
from smetric_router.admission.order import ANONYMOUS

# The tenant --api-key's key becomes when it is given with --api-key-file.
DEFAULT = "default"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

_Positive = Annotated[float, msgspec.Meta(gt=0)]


class _Entry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]
    key: str | None = None
    key_env: str | None = None
    requests_per_minute: _Positive | None = None
    tokens_per_minute: _Positive | None = None
    weight: _Positive = 1.0
    max_priority: int | None = None


class _File(msgspec.Struct, forbid_unknown_fields=True):
    tenants: list[_Entry]


class KeyFileError(ValueError):
    """The key file cannot be read or is not a list of tenants this router can take."""


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    key: str = field(repr=False)
    limits: Limits = field(default_factory=Limits)
    weight: float = 1.0
    max_priority: int | None = None  # None: any priority


def valid_key(key: str) -> bool:
    """A key goes into an HTTP header: non-empty printable ASCII, no blanks."""
    return bool(key) and not any(c.isspace() or not c.isprintable() or not c.isascii() for c in key)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode(errors="surrogateescape")).digest()


class TenantTable:
    """The tenants by key. identify() compares the given key with every tenant's, in constant
    time each and without stopping at a match, so the time taken says nothing of which key (or
    how much of one) matched."""

    def __init__(self, tenants: Sequence[Tenant]) -> None:
        names: set[str] = set()
        digests: set[bytes] = set()
        for t in tenants:
            if t.name in names:
                raise KeyFileError(f"tenant name {t.name!r} appears twice")
            names.add(t.name)
            if not valid_key(t.key):
                raise KeyFileError(
                    f"tenant {t.name!r}: its key must be non-empty printable ASCII without blanks"
                )
            d = _digest(t.key)
            if d in digests:
                raise KeyFileError(f"tenant {t.name!r} has the same key as another tenant")
            digests.add(d)
        if not tenants:
            raise KeyFileError("the key file lists no tenant")
        self.tenants = tuple(tenants)
        self._digests = [(_digest(t.key), t) for t in self.tenants]

    def __iter__(self) -> Iterator[Tenant]:
        return iter(self.tenants)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tenants)

    def identify(self, key: str) -> Tenant | None:
        given = _digest(key)
        found = None
        for digest, tenant in self._digests:
            if hmac.compare_digest(given, digest):
                found = tenant
        return found

    def weights(self) -> dict[str, float]:
        return {t.name: t.weight for t in self.tenants}

    def limits(self) -> list[tuple[str, Limits]]:
        return [(t.name, t.limits) for t in self.tenants]

    def describe(self) -> str:
        """One start-up log line: the tenants' names and settings (never a key)."""
        parts = []
        for t in self.tenants:
            bits = [f"weight {t.weight:g}"]
            if t.limits.requests_per_minute is not None:
                bits.append(f"{t.limits.requests_per_minute:g} requests/min")
            if t.limits.tokens_per_minute is not None:
                bits.append(f"{t.limits.tokens_per_minute:g} tokens/min")
            if t.max_priority is not None:
                bits.append(f"max priority {t.max_priority}")
            parts.append(f"{t.name} ({', '.join(bits)})")
        return "; ".join(parts)


def _where(message: str) -> str:
    """msgspec's path from the document's root `$` as the file's own (`tenants[0].weight`)."""
    return message.replace("`$.", "`").replace("at `$`", "at the top level")


def _yaml_problem(e: yaml.YAMLError) -> str:
    """What is wrong and where, without the snippet of the file PyYAML quotes (it may be a
    key)."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        return f"{e.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return type(e).__name__


def parse_key_file(text: str, env: Mapping[str, str], name: str = "key file") -> list[Tenant]:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise KeyFileError(f"{name} is neither JSON nor YAML: {_yaml_problem(e)}") from None
    try:
        entries = msgspec.convert(raw, _File, strict=True).tenants
    except msgspec.ValidationError as e:
        raise KeyFileError(f"{name}: {_where(str(e))}") from None
    tenants = []
    for i, entry in enumerate(entries):
        where = f"{name}: tenants[{i}] ({entry.name})"
        if (entry.key is None) == (entry.key_env is None):
            raise KeyFileError(f"{where}: give exactly one of `key` and `key_env`")
        if entry.key_env is not None:
            key = env.get(entry.key_env) or ""
            if not key:
                raise KeyFileError(f"{where}: the environment variable {entry.key_env} is not set")
        else:
            assert entry.key is not None
            key = entry.key
        if not valid_key(key):
            raise KeyFileError(f"{where}: the key must be non-empty printable ASCII without blanks")
        limits = Limits(entry.requests_per_minute, entry.tokens_per_minute)
        tenants.append(Tenant(entry.name, key, limits, entry.weight, entry.max_priority))
    return tenants


def load_tenants(
    path: str, api_key: str | None = None, env: Mapping[str, str] | None = None
) -> TenantTable:
    """--api-key-file's tenants; with --api-key too, its key is one more tenant, "default"
    (weight 1, no limits, any priority)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise KeyFileError(f"cannot read the key file {path}: {e.strerror or e}") from None
    tenants = parse_key_file(text, os.environ if env is None else env, path)
    if api_key is not None:
        tenants.append(Tenant(DEFAULT, api_key))
    try:
        return TenantTable(tenants)
    except KeyFileError as e:
        also = " (the --api-key is tenant 'default')" if api_key is not None else ""
        raise KeyFileError(f"{path}: {e}{also}") from None


__all__ = ["ANONYMOUS", "DEFAULT", "KeyFileError", "Tenant", "TenantTable", "load_tenants"]
