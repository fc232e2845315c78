"""Step-time model from a precomputed GPU profile (engine/profiles/<name>.json).

A step is one forward over T tokens (prefill chunk tokens + one per decoding request):

    step = layers * (linear(T) + moe(T) + ep_comm(T)
                     + sum over prefill chunks of [A(ctx + q) - A(ctx)]
                     + decode_attn(total KV tokens of the decoding requests))
           + lm_head(sequences needing logits) + step_overhead

- linear(T): QKV/O projections, router gate and the memory-bound elementwise traffic, per layer.
- moe(T): routed-expert grouped GEMMs (up/gate and down) per layer for the chosen expert layout.
- A(s): causal attention time of a whole sequence of length s, so a chunk of q tokens on top of a
  cached context ctx costs the difference (its extra query rows against ctx + its own triangle).
- decode_attn: memory-bound, affine in the KV tokens read.
All tables are per layer in microseconds; build_profile.py documents where each number comes from.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

PROFILES_DIR = Path(__file__).parent / "profiles"


@dataclass(frozen=True, slots=True)
class Curve:
    """Piecewise-linear in x; flat below the first point, last slope beyond the last one."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        i = bisect.bisect_right(xs, x)
        if i >= len(xs):
            i = len(xs) - 1
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True, slots=True)
class PowerCurve:
    """Interpolated in log-log space (attention cost grows like a power of the length)."""

    log_xs: tuple[float, ...]
    log_ys: tuple[float, ...]

    @classmethod
    def from_points(cls, xs: Sequence[float], ys: Sequence[float]) -> PowerCurve:
        return cls(tuple(math.log(x) for x in xs), tuple(math.log(y) for y in ys))

    def __call__(self, x: float) -> float:
        if x <= 0:
            return 0.0
        lx = math.log(x)
        xs, ys = self.log_xs, self.log_ys
        i = min(max(bisect.bisect_right(xs, lx), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return math.exp(y0 + (y1 - y0) * (lx - x0) / (x1 - x0))


def _curve(d: dict[str, Any]) -> Curve:
    return Curve(tuple(float(x) for x in d["tokens"]), tuple(float(y) for y in d["us"]))


class TimingModel:
    def __init__(self, profile: dict[str, Any], ep_size: int = 1) -> None:
        self.profile = profile
        self.name: str = profile["name"]
        self.layers: int = profile["model"]["layers"]
        self.kv_bytes_per_token: int = profile["model"]["kv_bytes_per_token"]
        self.gpu_kv_tokens: int = profile["memory"]["gpu_kv_tokens"]
        self.host_kv_tokens: int = profile["memory"]["host_kv_tokens"]
        self.pcie_bytes_per_s: float = profile["transfer"]["pcie_bytes_per_s"]
        self.storage_bytes_per_s: float = profile["transfer"]["storage_bytes_per_s"]
        per_layer = profile["per_layer"]
        self._linear = _curve(per_layer["linear"])
        moe = per_layer["moe_by_ep"].get(str(ep_size))
        if moe is None:
            raise ValueError(f"profile {self.name} has no MoE table for ep_size={ep_size}")
        self._moe = _curve(moe)
        self._ep_size = ep_size
        comm = per_layer["ep_comm"]
        self._comm_fixed_us: float = comm["fixed_us"] if ep_size > 1 else 0.0
        self._comm_us_per_token: float = comm["us_per_token"] if ep_size > 1 else 0.0
        attn = per_layer["attn_prefill_causal"]
        self._attn = PowerCurve.from_points(attn["seq_len"], attn["us"])
        dec = per_layer["attn_decode"]
        self._dec_fixed_us: float = dec["fixed_us"]
        self._dec_us_per_kv_token: float = dec["us_per_kv_token"]
        lm = profile["lm_head"]
        self._lm_fixed_us: float = lm["weight_read_us"]
        self._lm_us_per_seq: float = lm["us_per_seq"]
        self._overhead_s: float = profile["step_overhead_us"] * 1e-6

    @classmethod
    def load(cls, name: str, ep_size: int = 1) -> TimingModel:
        return cls(load_profile(name), ep_size)

    def step_seconds(
        self, prefill: Sequence[tuple[int, int]], n_decode: int, decode_kv_tokens: int
    ) -> float:
        """prefill: (cached context, new tokens) per chunk; decode: requests and their KV tokens."""
        tokens = n_decode
        attn_us = 0.0
        for ctx, q in prefill:
            tokens += q
            attn_us += self._attn(ctx + q) - self._attn(ctx)
        if tokens == 0:
            return 0.0
        layer_us = self._linear(tokens) + self._moe(tokens) + attn_us
        if n_decode:
            layer_us += self._dec_fixed_us + self._dec_us_per_kv_token * decode_kv_tokens
        if self._ep_size > 1:
            layer_us += self._comm_fixed_us + self._comm_us_per_token * tokens
        seqs = len(prefill) + n_decode
        lm_us = max(self._lm_fixed_us, self._lm_us_per_seq * seqs)
        return (self.layers * layer_us + lm_us) * 1e-6 + self._overhead_s

    def decode_run_seconds(self, n_decode: int, kv_tokens: int, k: int) -> float:
        """k pure-decode steps of n_decode requests starting at kv_tokens, each step adding one
        token per request. A decode step's time is affine in the KV tokens read, so the sum is
        closed-form: k * step(kv) + slope * n * k(k-1)/2."""
        if k <= 0 or n_decode <= 0:
            return 0.0
        first = self.step_seconds((), n_decode, kv_tokens)
        slope = self.layers * self._dec_us_per_kv_token * 1e-6  # seconds per KV token
        return k * first + slope * n_decode * k * (k - 1) / 2

    def decode_steps_to_reach(
        self, n_decode: int, kv_tokens: int, seconds: float, k_max: int
    ) -> int:
        """The fewest pure-decode steps (as in decode_run_seconds) lasting >= seconds, at most k_max
        and at least 1."""
        first = self.step_seconds((), n_decode, kv_tokens)
        a = self.layers * self._dec_us_per_kv_token * 1e-6 * n_decode / 2
        b = first - a
        if a > 0:
            k = math.ceil((-b + math.sqrt(b * b + 4 * a * max(seconds, 0.0))) / (2 * a))
        else:
            k = math.ceil(max(seconds, 0.0) / first)
        k = min(max(k, 1), k_max)
        # the closed form can be off by one step through rounding
        while k > 1 and self.decode_run_seconds(n_decode, kv_tokens, k - 1) >= seconds:
            k -= 1
        while k < k_max and self.decode_run_seconds(n_decode, kv_tokens, k) < seconds:
            k += 1
        return k

    def host_load_seconds(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / self.pcie_bytes_per_s

    def storage_fetch_seconds(self, tokens: int) -> float:
        """Global tier -> host over the network, then host -> GPU over PCIe."""
        nbytes = tokens * self.kv_bytes_per_token
        return nbytes / self.storage_bytes_per_s + nbytes / self.pcie_bytes_per_s


@cache
def load_profile(name: str) -> dict[str, Any]:
    path = PROFILES_DIR / f"{name}.json"
    with path.open() as f:
        data: dict[str, Any] = json.load(f)
    return data
