"""Build engine/profiles/*.json from the measured H20 kernel tables (run offline, once).

    python -m smetric_router.engine.build_profile [--data ../shared/reference/h20-kernel-data]

Sources (alibaba/InferSim bench_data, Apache-2.0, copied to shared/reference/h20-kernel-data):
- mha/prefill/h20/32-4-128.csv: FA3 BF16 causal attention latency per sequence length.
- mha/decode/h20/32-4-128.csv: FlashInfer BF16 decode attention by batch size and KV length.
- gemm/h20/data.csv: DeepGEMM dense GEMMs by (m, k, n).
- grouped_gemm/{prefill,decode}/h20/data.csv: DeepGEMM grouped GEMMs (contiguous layout for
  prefill, masked layout for decode) for 128 experts / top-8 / hidden 2048 / expert FFN 768, i.e.
  exactly Qwen3-30B-A3B's routed experts, with 1 GPU (128 local experts) and EP4 (32 local).

Modelling assumptions (each one named where it is used below):
- FP8 -> BF16: both GEMM tables were measured with DeepGEMM's FP8 kernels (their MFU column is
  relative to 296 TFLOPS: e.g. m=16384, k=2048, n=5120 runs 1258 us = 273 TFLOPS, above BF16's 148).
  Qwen3-Coder-30B-A3B is served in BF16, so every GEMM time is doubled: compute-bound kernels run at
  the same MFU against half the peak, weight-bound ones move twice the bytes. (InferSim makes the
  same assumption: it divides the same FLOPs by fp16_tflops * MFU.)
- Routed experts touched: the decode table's masked layout reads every local expert's weights
  whatever the batch (its 16-token time equals reading all of them), while a BF16 fused-MoE kernel
  reads only the experts its tokens are routed to. MoE time is therefore scaled by the expected
  share of experts touched, 1 - (1 - topk/experts)^tokens (uniform routing): 6 % at 1 token, 64 %
  at 16, over 99 % from 72 tokens on, so prefill and the batched anchors are unaffected.
- Router gate (2048 -> 128) has no measured shape; it uses the nearest measured k=2048 shape
  (n=576) scaled by 128/576, never below that shape's smallest (launch-bound) latency.
- Elementwise traffic (RMSNorms, rotary, KV store, MoE permute / SiLU-mul / combine) is
  memory-bound: bytes per token counted from the shapes, at the HBM bandwidth the decode-attention
  kernel achieves in the same tables.
- LM head: only the sequences that need logits; max(weight read, FLOPs at the dense tables' MFU).
- step_overhead_us: CPU-side scheduling, batch preparation and sampling per step that the forward
  tables do not contain (InferSim allows 5 ms per decode step for the same thing).
- H200: derived by scaling, not measured (see _scale_to).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smetric_router.engine.timing import PROFILES_DIR, TimingModel

DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "reference" / "h20-kernel-data"
TOKEN_GRID = (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
FP8_TO_BF16 = 2.0
STEP_OVERHEAD_US = 5000.0


@dataclass(frozen=True, slots=True)
class Gpu:
    name: str
    bf16_flops: float
    hbm_bytes_per_s: float
    hbm_bytes: float
    pcie_bytes_per_s: float
    nvlink_bytes_per_s: float  # unidirectional, per GPU


H20 = Gpu("H20", 148e12, 4.0e12, 96e9, 50e9, 450e9)
H200 = Gpu("H200", 989e12, 4.8e12, 141e9, 50e9, 450e9)


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    topk: int
    expert_ffn: int
    vocab: int
    weight_bytes: float

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    @property
    def kv_bytes_per_token_layer(self) -> int:
        return 2 * self.kv_heads * self.head_dim * 2

    def elementwise_bytes_per_token_layer(self) -> int:
        """BF16 bytes read + written per token per layer outside GEMMs and attention."""
        h = self.hidden * 2
        qk = (self.heads + self.kv_heads) * self.head_dim * 2
        rmsnorm = 2 * h  # input norm: read + write
        rotary = 2 * qk
        kv_store = self.kv_bytes_per_token_layer
        add_norm = 4 * h  # fused residual add + post-attention norm
        dispatch = (1 + self.topk) * h  # read the token, write one copy per chosen expert
        silu_mul = self.topk * (2 * self.expert_ffn * 2 + self.expert_ffn * 2)
        combine = (self.topk + 1) * h
        return rmsnorm + rotary + kv_store + add_norm + dispatch + silu_mul + combine


def qwen3_30b_a3b(cfg: dict[str, Any]) -> Model:
    return Model(
        name="Qwen3-Coder-30B-A3B-Instruct (BF16)",
        layers=cfg["num_hidden_layers"],
        hidden=cfg["hidden_size"],
        heads=cfg["num_attention_heads"],
        kv_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"],
        experts=cfg["num_experts"],
        topk=cfg["num_experts_per_tok"],
        expert_ffn=cfg["moe_intermediate_size"],
        vocab=cfg["vocab_size"],
        weight_bytes=61e9,  # 30.5B parameters in BF16
    )


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if x <= xs[i] or i == len(xs) - 1:
            return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    raise AssertionError("unreachable")


class Tables:
    def __init__(self, data: Path, model: Model) -> None:
        self.model = model
        self.gemm: dict[tuple[int, int], list[tuple[int, float]]] = {}
        for r in _rows(data / "gemm" / "h20" / "data.csv"):
            key = (int(r["k"]), int(r["n"]))
            self.gemm.setdefault(key, []).append((int(r["m"]), float(r["latency_us"])))
        for pts in self.gemm.values():
            pts.sort()
        self.dense_mfu_large = statistics.median(
            float(r["mfu"])
            for r in _rows(data / "gemm" / "h20" / "data.csv")
            if int(r["m"]) >= 4096
        )
        mha = f"{model.heads}-{model.kv_heads}-{model.head_dim}.csv"
        pre = _rows(data / "mha" / "prefill" / "h20" / mha)
        self.attn_seq = [int(r["seq_len"]) for r in pre]
        self.attn_us = [float(r["latency_us"]) for r in pre]
        self.decode_rows = [
            (int(r["batch_size"]), int(r["kv_len"]), float(r["latency_us"]))
            for r in _rows(data / "mha" / "decode" / "h20" / mha)
            if r["kv_dtype"] == "bf16"
        ]
        self.moe: dict[int, list[tuple[int, float]]] = {}
        for phase, col in (("decode", "batch_size_per_gpu"), ("prefill", "seq_len_per_gpu")):
            for r in _rows(data / "grouped_gemm" / phase / "h20" / "data.csv"):
                if (
                    int(r["num_experts"]),
                    int(r["topk"]),
                    int(r["hidden_size"]),
                    int(r["intermediate_size"]),
                ) != (model.experts, model.topk, model.hidden, model.expert_ffn):
                    continue
                us = float(r["up_proj_us"]) + float(r["down_proj_us"])
                self.moe.setdefault(int(r["num_gpus"]), []).append((int(r[col]), us))
        for pts in self.moe.values():
            pts.sort()

    def gemm_us(self, m: float, k: int, n: int) -> float:
        pts = self.gemm[(k, n)]
        return FP8_TO_BF16 * _interp([p[0] for p in pts], [p[1] for p in pts], m)

    def gate_us(self, m: float) -> float:
        ref = self.gemm_us(m, self.model.hidden, 576)
        return max(ref * self.model.experts / 576, self.gemm_us(1, self.model.hidden, 576))

    def moe_us(self, ep: int, tokens: float) -> float:
        pts = self.moe[ep]
        return FP8_TO_BF16 * _interp([p[0] for p in pts], [p[1] for p in pts], tokens)

    def decode_fit(self) -> tuple[float, float, float]:
        """Least squares latency = a + b * (batch * kv_len) over the bandwidth-bound rows
        (>= 64K KV tokens; below that the kernel is launch-bound). Returns a, b, max rel. error."""
        pts = [(bs * kv, us) for bs, kv, us in self.decode_rows if bs * kv >= 65536]
        n = len(pts)
        mx = sum(p[0] for p in pts) / n
        my = sum(p[1] for p in pts) / n
        b = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
        a = max(my - b * mx, min(us for _, _, us in self.decode_rows))
        err = statistics.median(abs(a + b * x - y) / y for x, y in pts)
        return a, b, err


def build(data: Path, gpu: Gpu) -> dict[str, Any]:
    with (data / "hf_configs" / "qwen3-30B-A3B_config.json").open() as f:
        model = qwen3_30b_a3b(json.load(f))
    t = Tables(data, model)
    dec_fixed, dec_per_tok, dec_err = t.decode_fit()
    hbm_eff = model.kv_bytes_per_token_layer / (dec_per_tok * 1e-6) / H20.hbm_bytes_per_s
    ew_bytes = model.elementwise_bytes_per_token_layer()
    scale = _scale_to(gpu, hbm_eff)
    d = model.hidden
    q_out = (model.heads + 2 * model.kv_heads) * model.head_dim
    o_in = model.heads * model.head_dim

    def linear(m: float) -> float:
        qkv = scale(t.gemm_us(m, d, q_out), _gemm_bytes(m, d, q_out))
        o = scale(t.gemm_us(m, o_in, d), _gemm_bytes(m, o_in, d))
        gate = scale(t.gate_us(m), _gemm_bytes(m, d, model.experts))
        ew = m * ew_bytes / (gpu.hbm_bytes_per_s * hbm_eff) * 1e6
        return qkv + o + gate + ew

    def moe(ep: int) -> Callable[[float], float]:
        local = model.experts // ep
        w = 3 * model.hidden * model.expert_ffn * 2

        def f(m: float) -> float:
            pairs = m * model.topk
            touched = _experts_touched(m, model.topk, model.experts)
            nbytes = touched * local * w + pairs * 2 * (model.hidden + model.expert_ffn) * 2
            return scale(t.moe_us(ep, m) * touched, nbytes)

        return f

    attn_scaled = [scale(us, 0.0) for us in t.attn_us]
    lm_bytes = model.hidden * model.vocab * 2
    lm_flops = 2 * model.hidden * model.vocab
    kv_tokens = _gpu_kv_tokens(gpu, model)
    # dispatch + combine; with EP4, 3 of 4 GPUs are remote for each top-8 copy
    comm_bytes_per_token = 2 * 0.75 * model.topk * model.hidden * 2
    profile: dict[str, Any] = {
        "name": f"{gpu.name.lower()}-qwen3-coder-30b-a3b",
        "gpu": gpu.name,
        "model": {
            "name": model.name,
            "layers": model.layers,
            "kv_bytes_per_token": model.kv_bytes_per_token,
            "weight_bytes": model.weight_bytes,
        },
        "memory": {
            "gpu_kv_tokens": kv_tokens,
            "host_kv_tokens": 2 * kv_tokens,
            "notes": (
                f"GPU KV = ({gpu.hbm_bytes / 1e9:.0f} GB HBM - {model.weight_bytes / 1e9:.0f} GB"
                f" BF16 weights - {_RESERVE / 1e9:.0f} GB activations, CUDA graphs and workspace)"
                f" / {model.kv_bytes_per_token} B per token, floored to 256 tokens. Host tier"
                " default: SGLang's --hicache-ratio 2 (twice the GPU pool in pinned host memory)."
            ),
        },
        "transfer": {
            "pcie_bytes_per_s": gpu.pcie_bytes_per_s,
            "storage_bytes_per_s": 21.75e9,
            "notes": (
                "PCIe Gen5 x16 is 64 GB/s per direction; 50 GB/s assumed achieved by host<->GPU"
                " copies (HiCache, LMCache). Global tier (Mooncake over RDMA):"
                " storage_bytes_per_s is one 200 Gb/s NIC, 21.75 GB/s achieved (Mooncake's"
                " transfer engine: 87 GB/s over 4 x 200 Gbps RoCE, kvcache-ai/Mooncake README),"
                " what an engine on its own (the emulator) gets. The simulator does not use it:"
                " it models one NIC per server of 8 GPUs by default (SimConfig.nics_per_server,"
                " nic_bytes_per_s), shared by the server's instances' reads and writes"
                " (sim/tiers.py)."
            ),
        },
        "per_layer": {
            "linear": _table(linear),
            "moe_by_ep": {str(ep): _table(moe(ep)) for ep in sorted(t.moe) if ep in (1, 4)},
            "ep_comm": {
                "fixed_us": 2 * 10.0,
                "us_per_token": comm_bytes_per_token / gpu.nvlink_bytes_per_s * 1e6,
                "notes": (
                    "Only for the EP4 anchor: DP attention + EP MoE, one dispatch and one combine"
                    " all-to-all per layer, 10 us latency each (assumed), 3/4 of each token's"
                    " top-8 copies cross NVLink (450 GB/s per direction)."
                ),
            },
            "attn_prefill_causal": {"seq_len": t.attn_seq, "us": attn_scaled},
            "attn_decode": {
                "fixed_us": dec_fixed,
                "us_per_kv_token": dec_per_tok * H20.hbm_bytes_per_s / gpu.hbm_bytes_per_s,
                "notes": (
                    f"Least-squares fit of the H20 decode table over rows with >= 64K KV tokens;"
                    f" median relative error {dec_err:.1%}; implies {hbm_eff:.0%} of HBM peak,"
                    " the efficiency also used for elementwise traffic and LM-head reads."
                ),
            },
        },
        "lm_head": {
            "weight_read_us": lm_bytes / (gpu.hbm_bytes_per_s * hbm_eff) * 1e6,
            "us_per_seq": lm_flops / (gpu.bf16_flops * t.dense_mfu_large) * 1e6,
        },
        "step_overhead_us": STEP_OVERHEAD_US,
        "elementwise_bytes_per_token_layer": ew_bytes,
        "sources": __doc__,
    }
    if gpu is H20:
        profile["anchors"] = _anchors(profile)
    else:
        profile["derived"] = (
            f"{gpu.name} is derived from the H20 tables, not measured: each kernel time becomes"
            f" max(H20 time * {H20.bf16_flops / 1e12:.0f}/{gpu.bf16_flops / 1e12:.0f} TFLOPS,"
            f" its bytes at {gpu.hbm_bytes_per_s / 1e12:.1f} TB/s * the H20-measured HBM"
            " efficiency), i.e. the H20 MFU is assumed to carry over; launch-bound kernels are"
            " not allowed below the smallest H20 latency of their family."
        )
    return profile


_RESERVE = 8e9


def _anchors(profile: dict[str, Any]) -> dict[str, Any]:
    """How near the model lands to SGLang's measured figures, in their settings."""
    one, ep4 = TimingModel(profile), TimingModel(profile, ep_size=4)
    prefill = 16384 / one.step_seconds([(0, 4096)] * 4, 0, 0)
    # mean decode context over a 2,048-token output after a 4,096-token prompt
    tpot = ep4.step_seconds([], 100, 100 * (4096 + 1024))
    return {
        "prefill_tokens_per_gpu_s": {"model": round(prefill), "sglang": 16594},
        "decode_tokens_per_gpu_s": {"model": round(100 / tpot), "sglang": 2749},
        "decode_tpot_ms": {"model": round(tpot * 1e3, 1), "sglang": 38},
        "notes": (
            f"prefill: one step of 4 x 4,096-token prompts (16,384 tokens), 1 GPU:"
            f" {prefill / 16594 - 1:+.1%}. decode: the anchor ran 4 GPUs with DP attention and"
            " EP4 MoE; modelled per GPU as its own 100 requests' attention plus the EP4"
            " grouped-GEMM table (32 local experts, 800 token-expert pairs) plus two all-to-alls"
            f" per layer: {100 / tpot / 2749 - 1:+.1%}. The engine's default layout is one GPU"
            f" per instance (all 128 experts local): batch 100 decodes at"
            f" {100 / one.step_seconds([], 100, 100 * 5120):.0f} tokens/s there."
            " tests/engine/test_timing_calibration.py checks both anchors through the engine."
        ),
    }


def _experts_touched(tokens: float, topk: int, experts: int) -> float:
    """Expected share of the experts that tokens routed top-k (uniformly) reach at least once."""
    return 1.0 - float((1.0 - topk / experts) ** tokens)


def _gpu_kv_tokens(gpu: Gpu, model: Model) -> int:
    free = gpu.hbm_bytes - model.weight_bytes - _RESERVE
    return int(free / model.kv_bytes_per_token) // 256 * 256


def _gemm_bytes(m: float, k: int, n: int) -> float:
    return 2.0 * (m * k + k * n + m * n)


def _scale_to(gpu: Gpu, hbm_eff: float) -> Callable[[float, float], float]:
    if gpu is H20:
        return lambda us, _nbytes: us
    compute = H20.bf16_flops / gpu.bf16_flops
    floor_us = 5.0

    def scale(us: float, nbytes: float) -> float:
        mem_us = nbytes / (gpu.hbm_bytes_per_s * hbm_eff) * 1e6
        return max(us * compute, mem_us, min(us, floor_us))

    return scale


def _table(f: Callable[[float], float]) -> dict[str, list[float]]:
    return {"tokens": list(TOKEN_GRID), "us": [round(f(m), 3) for m in TOKEN_GRID]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--out", type=Path, default=PROFILES_DIR)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for gpu in (H20, H200):
        profile = build(args.data, gpu)
        path = args.out / f"{profile['name']}.json"
        path.write_text(json.dumps(profile, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
