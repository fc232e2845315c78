"""The tiny model real SGLang workers serve in tests and on CPU: made here, never downloaded.

A Qwen3 dense config (2 layers, hidden 64) over the project's bundled byte-level BPE tokenizer,
with a Qwen3-Coder-style chat template (tools in the system turn, tool calls and responses in
tags), so tests send what coding agents send. SGLang loads it with `--load-format dummy`: the
weights are random, so the text is gibberish; token counts, caching, events and load are real.

    python -m smetric_router.launch.tiny_model [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

ASSETS = Path(__file__).resolve().parents[1] / "assets"
TOKENIZER_DIR = ASSETS / "tokenizer"
TEMPLATE = ASSETS / "tiny_model" / "chat_template.jinja"
DEFAULT_DIR = Path(__file__).resolve().parents[2] / ".smetric" / "tiny-qwen3"
MAX_CONTEXT = 32768


def _files() -> dict[str, str]:
    tok_cfg = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    tok_cfg["chat_template"] = TEMPLATE.read_text()
    tok_cfg["model_max_length"] = MAX_CONTEXT
    tokenizer = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text())
    vocab = len(tokenizer["model"]["vocab"])
    ids = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    eos, pad = ids["<|im_end|>"], ids["<|endoftext|>"]
    config: dict[str, Any] = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": vocab,
        "max_position_embeddings": MAX_CONTEXT,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "torch_dtype": "bfloat16",
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "use_sliding_window": False,
    }
    generation = {"eos_token_id": eos, "pad_token_id": pad, "do_sample": False}
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

    def dump(obj: object) -> str:
        return json.dumps(obj, indent=1, sort_keys=True) + "\n"

    return {
        "config.json": dump(config),
        "generation_config.json": dump(generation),
        "special_tokens_map.json": dump(special),
        "tokenizer_config.json": dump(tok_cfg),
    }


def ensure_tiny_model(out: Path = DEFAULT_DIR) -> Path:
    """Write the model directory unless it already holds exactly these files; return it."""
    files = _files()
    digest = hashlib.sha256(
        json.dumps(files, sort_keys=True).encode() + (TOKENIZER_DIR / "tokenizer.json").read_bytes()
    ).hexdigest()
    stamp = out / ".smetric-digest"
    if stamp.is_file() and stamp.read_text() == digest:
        return out
    out.mkdir(parents=True, exist_ok=True)
    # Several launchers may write it at once (a test starting stacks side by side): each file is
    # written aside and renamed into place, so a reader never sees one half written.
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
        shutil.copyfile(TOKENIZER_DIR / "tokenizer.json", Path(tmp) / "tokenizer.json")
        for name, text in files.items():
            (Path(tmp) / name).write_text(text)
        (Path(tmp) / stamp.name).write_text(digest)
        for name in ("tokenizer.json", *files, stamp.name):  # the stamp last: all are in place
            os.replace(Path(tmp) / name, out / name)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m smetric_router.launch.tiny_model",
                                description=__doc__.split("\n\n")[1])  # fmt: skip
    p.add_argument("--out", type=Path, default=DEFAULT_DIR, help="model directory to write")
    print(ensure_tiny_model(p.parse_args(argv).out))


if __name__ == "__main__":
    main()
