"""SGLang page hashes against vectors computed with SGLang's own hash code."""

from __future__ import annotations

import json
import random
from array import array
from pathlib import Path

import pytest

from smetric_router.features.hashing import ChainState, page_digests, page_hashes
from tests.shared_ref import SHARED, require_shared

# The vectors are copied next to this test so the suite is self-contained; when the shared
# reference is present (it is in CI) the copy must not have drifted from it.
FIXTURE = Path(__file__).with_name("sglang_page_hash_vectors.json")
SHARED_VECTORS = SHARED / "reference" / "sglang-page-hash-vectors.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


def test_fixture_matches_shared_reference() -> None:
    shared = require_shared(SHARED_VECTORS)
    assert json.loads(shared.read_text()) == json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"page{c['page_size']}-{len(c['token_ids'])}")
def test_sglang_vectors(case: dict[str, object]) -> None:
    tokens = case["token_ids"]
    page_size = case["page_size"]
    assert isinstance(tokens, list) and isinstance(page_size, int)
    assert [d.hex() for d in page_digests(tokens, page_size)] == case["page_hash_hex"]
    assert page_hashes(tokens, page_size) == case["event_block_hashes_int64"]


def test_only_full_pages_and_chaining() -> None:
    tokens = list(range(100, 140))
    assert len(page_hashes(tokens, 16)) == 2
    digests = page_digests(tokens, 16)
    # Hashing the second page after the first page's digest continues the same chain.
    assert page_digests(tokens[16:32], 16, digests[0]) == digests[1:]
    assert page_hashes(tokens[:15], 16) == []


def test_array_and_list_inputs_agree() -> None:
    tokens = [random.Random(1).randrange(2**32) for _ in range(64)]
    assert page_hashes(array("I", tokens), 16) == page_hashes(tokens, 16)


def test_rejects_out_of_range_ids_and_bad_page_size() -> None:
    with pytest.raises(ValueError, match="uint32"):
        page_hashes([2**32] * 16, 16)
    with pytest.raises(ValueError, match="uint32"):
        page_hashes([-1] * 16, 16)
    with pytest.raises(ValueError, match="page_size"):
        page_hashes([1] * 16, 0)


@pytest.mark.parametrize("page_size", [1, 7, 16, 64])
def test_chain_state_extends_like_a_full_hash(page_size: int) -> None:
    rng = random.Random(page_size)
    tokens = [rng.randrange(8192) for _ in range(500)]
    state = ChainState(page_size)
    got: list[int] = []
    start = 0
    while start < len(tokens):
        end = start + rng.randint(0, 40)
        state, new = state.extend(tokens[start:end])
        got += new
        start = end
    assert got == page_hashes(tokens, page_size)
    assert state.tokens == len(tokens)
    assert list(state.tail) == tokens[len(tokens) - len(tokens) % page_size :]
