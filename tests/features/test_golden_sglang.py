"""The router's prompt token ids equal SGLang 0.5.23's own (golden equality).

Each case runs tests/features/sglang_scripts/golden_chat.py in the CPU SGLang environment, where
hypothesis generates chat requests (roles, tools, tool calls and results, reasoning, content with
leading/trailing whitespace, newlines, unicode, special-token text, empty and null content, text
and image parts, a final assistant turn, continue_final_message) and raw text prompts, and checks
the router's FeatureExtractor against SGLang's OpenAIServingChat and transformers'
apply_chat_template(tokenize=True): token ids, page hashes, turn and est_hit.

One run of the script checks every configuration (tests/helpers/golden.py: SMETRIC_GOLDEN_EXAMPLES
sets the conversations per tokenizer and template).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.golden import EXAMPLES, golden_runs

pytestmark = pytest.mark.sglang

SCRIPT = Path(__file__).parent / "sglang_scripts" / "golden_chat.py"
CONFIGS = ("bundled", "tiny-coder", "qwen3-thinking")


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    return golden_runs(SCRIPT, CONFIGS)


@pytest.mark.parametrize("config", CONFIGS)
def test_router_ids_equal_sglang(results: dict[str, Any], config: str) -> None:
    out = results[config]
    assert out["ok"], out["failure"]
    assert out["examples"] >= EXAMPLES and out["text_prompts"] >= EXAMPLES, out
    assert out["requests"] - out["refused"] >= EXAMPLES, out
