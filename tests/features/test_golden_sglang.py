"""The router's prompt token ids equal SGLang 0.5.23's own (golden equality).

Each case runs tests/features/sglang_scripts/golden_chat.py in the CPU SGLang environment, where
hypothesis generates chat requests (roles, tools, tool calls and results, reasoning, content with
leading/trailing whitespace, newlines, unicode, special-token text, empty and null content, text
and image parts, a final assistant turn, continue_final_message) and raw text prompts, and checks
the router's FeatureExtractor against SGLang's OpenAIServingChat and transformers'
apply_chat_template(tokenize=True): token ids, page hashes, turn and est_hit.

SMETRIC_GOLDEN_EXAMPLES sets the conversations per tokenizer and template (default 500, as the
Messages and Responses golden tests; a deeper search is a larger value).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.sglang_env import run_sglang_script

pytestmark = pytest.mark.sglang

SCRIPT = Path(__file__).parent / "sglang_scripts" / "golden_chat.py"
EXAMPLES = int(os.environ.get("SMETRIC_GOLDEN_EXAMPLES", "500"))


@pytest.mark.parametrize("config", ["bundled", "tiny-coder", "qwen3-thinking"])
def test_router_ids_equal_sglang(config: str) -> None:
    out = run_sglang_script(SCRIPT, config, "--examples", str(EXAMPLES), timeout=1800)
    assert out["ok"], out["failure"]
    assert out["examples"] >= EXAMPLES and out["text_prompts"] >= EXAMPLES, out
    assert out["requests"] - out["refused"] >= EXAMPLES, out
