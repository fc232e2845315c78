"""The router's prompt for an Anthropic Messages request is SGLang 0.5.23's own.

Runs tests/features/sglang_scripts/golden_messages.py in the CPU SGLang environment: hypothesis
generates Messages bodies (system strings and blocks, inline system messages, tool_use /
tool_result chains, thinking and redacted_thinking, images, search results, tool references,
custom and server tools, every tool_choice, Claude Code's thinking / context_management /
metadata / betas) and checks that the chat body the router converts
each to renders and tokenizes to the ids SGLang's own AnthropicServing conversion and
OpenAIServingChat give (and the same page hashes, turn = assistant messages), and that the router
refuses what SGLang refuses. Templates with and without inline system messages are covered.

One run of the script checks every configuration (tests/helpers/golden.py: SMETRIC_GOLDEN_EXAMPLES
sets the bodies per configuration).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.golden import EXAMPLES, golden_runs

pytestmark = pytest.mark.sglang

SCRIPT = Path(__file__).parent / "sglang_scripts" / "golden_messages.py"
CONFIGS = ("bundled", "tiny-coder", "qwen3-thinking")


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    return golden_runs(SCRIPT, CONFIGS)


@pytest.mark.parametrize(
    ("config", "inline_system"),
    [("bundled", True), ("tiny-coder", True), ("qwen3-thinking", False)],
)
def test_router_messages_ids_equal_sglang(
    results: dict[str, Any], config: str, inline_system: bool
) -> None:
    out = results[config]
    assert out["ok"], out["failure"]
    assert out["inline_system"] is inline_system, out
    assert out["examples"] >= EXAMPLES, out
    # most bodies are accepted, and both refusals the router must reproduce occur
    assert out["requests"] - out["refused"] >= EXAMPLES, out
    assert any("redacted_thinking" in r for r in out["refusals"]), out
    # Claude Code's reasoning `thinking`: SGLang refuses every body that carries one, the router
    # forwards it without (and the ids above are SGLang's for the forwarded body)
    assert out["thinking_dropped"] > EXAMPLES // 10, out
    assert out["thinking_refused"] == out["thinking_dropped"], out
