"""The router's prompt for an OpenAI Responses request is SGLang 0.5.23's own.

Runs tests/features/sglang_scripts/golden_responses.py in the CPU SGLang environment: hypothesis
generates Responses bodies (input as a string or items: messages of every role, developer
messages, function and custom tool calls and their outputs, reasoning items, consecutive
assistant items of one turn; instructions; function, custom and built-in tools; every
tool_choice; reasoning.effort) and checks that the chat body the router converts each to renders
and tokenizes to the ids SGLang's own OpenAIServingResponses._make_request gives (and the same
page hashes, turn = the assistant messages of the conversion), and that the router refuses what
SGLang refuses. Templates with and without inline system messages are covered.

One run of the script checks every configuration (tests/helpers/golden.py: SMETRIC_GOLDEN_EXAMPLES
sets the bodies per configuration).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.golden import EXAMPLES, golden_runs

pytestmark = pytest.mark.sglang

SCRIPT = Path(__file__).parent / "sglang_scripts" / "golden_responses.py"
CONFIGS = ("bundled", "tiny-coder", "qwen3-thinking")


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    return golden_runs(SCRIPT, CONFIGS)


@pytest.mark.parametrize(
    ("config", "inline_system"),
    [("bundled", True), ("tiny-coder", True), ("qwen3-thinking", False)],
)
def test_router_responses_ids_equal_sglang(
    results: dict[str, Any], config: str, inline_system: bool
) -> None:
    out = results[config]
    assert out["ok"], out["failure"]
    assert out["inline_system"] is inline_system, out
    assert out["examples"] >= EXAMPLES, out
    assert out["requests"] - out["refused"] >= EXAMPLES * 0.9, out
    assert any("item_reference" in r for r in out["refusals"]), out
