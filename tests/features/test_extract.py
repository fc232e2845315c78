"""Turn, est_hit, hints, errors, cache reuse and incremental page hashes of the extractor."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from smetric_router.features.chat import ChatCodec, load_codec
from smetric_router.features.errors import FeatureError
from smetric_router.features.extract import FeatureExtractor, strip_hint
from smetric_router.features.hashing import page_hashes

Message = dict[str, Any]


@pytest.fixture(scope="module")
def codec() -> ChatCodec:
    return load_codec()


class CountingCodec(ChatCodec):
    """The bundled codec, counting the texts it tokenizes."""

    def __init__(self, base: ChatCodec) -> None:
        self.encoded: list[str] = []
        super().__init__(base._tok)

    def encode(self, text: str) -> list[int]:
        self.encoded.append(text)
        return super().encode(text)


def agent_turns(codec: ChatCodec, n_turns: int, seed: int) -> list[list[Message]]:
    """The message list of each request of one agent session: the first request, then each
    follow-up appending the previous reply (text or tool call) and a new user/tool message."""
    rng = random.Random(seed)
    messages: list[Message] = [
        {"role": "system", "content": "You are an agent. " * rng.randint(1, 30)},
        {"role": "user", "content": codec.sample_output(rng.randint(1, 60), seed)[0]},
    ]
    requests = [list(messages)]
    for turn in range(n_turns):
        if rng.random() < 0.5:
            call = {
                "id": f"c{turn}",
                "type": "function",
                "function": {"name": "f", "arguments": "{}"},
            }
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            content: Any = codec.sample_output(rng.randint(0, 90), seed + turn)[0]
            messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": content})
        else:
            reply = codec.sample_output(rng.randint(1, 50), seed + turn)[0]
            messages.append({"role": "assistant", "content": reply})
            parts = [{"type": "text", "text": "next "}, {"type": "text", "text": str(turn)}]
            messages.append({"role": "user", "content": parts})
        requests.append(list(messages))
    return requests


def test_first_turn(codec: ChatCodec) -> None:
    extractor = FeatureExtractor(codec, page_size=4)
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
    f = extractor.from_chat(body)
    prompt = codec.render_messages(body["messages"], add_generation_prompt=True)
    assert (f.turn, f.est_hit, f.prompt_len, f.model) == (0, 0, len(prompt), "m")
    assert list(f.page_hashes) == page_hashes(prompt, 4)
    assert f.text == "hello there"
    assert extractor.prompt_token_ids(body) == prompt


def test_follow_up_turn_and_est_hit(codec: ChatCodec) -> None:
    extractor = FeatureExtractor(codec, page_size=16)
    first: list[Message] = [{"role": "user", "content": "list the files"}]
    prompt = codec.render_messages(first, add_generation_prompt=True)
    reply, reply_ids = codec.sample_output(30, seed=3)
    follow_up = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "ok"}]
    f = extractor.from_chat({"messages": follow_up})
    # est_hit is exactly what the worker that answered cached: prompt + reply + <|im_end|>
    assert f.turn == 1
    assert f.est_hit == len(prompt) + len(reply_ids) + 1
    assert f.prompt_len == len(codec.render_messages(follow_up, add_generation_prompt=True))


def test_incremental_hashes_equal_full_render(codec: ChatCodec) -> None:
    for page_size in (1, 5, 16, 64):
        extractor = FeatureExtractor(codec, page_size=page_size, cache_entries=64)
        for seed in range(4):
            for turn, messages in enumerate(agent_turns(codec, 6, seed * 10 + page_size)):
                # a fresh parse each time, as the router sees it: no object is shared with the
                # previous turn's request
                f = extractor.from_chat({"messages": orjson.loads(orjson.dumps(messages))})
                prompt = codec.render_messages(messages, add_generation_prompt=True)
                assert list(f.page_hashes) == page_hashes(prompt, page_size)
                assert f.prompt_len == len(prompt)
                assert f.turn == turn


def test_follow_up_tokenizes_only_new_messages(codec: ChatCodec) -> None:
    counting = CountingCodec(codec)
    extractor = FeatureExtractor(counting, page_size=16)
    requests = agent_turns(codec, 3, seed=5)
    extractor.from_chat({"messages": requests[-2]})
    counting.encoded.clear()
    extractor.from_chat({"messages": requests[-1]})
    new_contents = [m["content"] for m in requests[-1][len(requests[-2]) :]]
    # one encode per new message's content (roles come from a small cache)
    assert len(counting.encoded) == 2
    assert all(isinstance(c, list) or c is None or c in counting.encoded for c in new_contents)
    counting.encoded.clear()
    extractor.from_chat({"messages": requests[-1]})
    assert counting.encoded == []


def test_tips_of_one_conversation_share_its_messages(codec: ChatCodec) -> None:
    # Every request is parsed anew, yet the retained history is held once, not once per turn.
    extractor = FeatureExtractor(codec, page_size=16)
    requests = agent_turns(codec, 6, seed=9)
    for messages in requests:
        extractor.from_chat(orjson.loads(orjson.dumps({"messages": messages})))
    kept = [tip[1] for tip in extractor._tips._data.values()]
    assert len(kept) == len(requests)
    first = kept[0]
    assert all(later[i] is first[i] for later in kept[1:] for i in range(len(first)))


def test_token_runs_are_shared_across_prefixes(codec: ChatCodec) -> None:
    counting = CountingCodec(codec)
    extractor = FeatureExtractor(counting, page_size=16)
    doc = {"role": "user", "content": "the same long document " * 20}
    extractor.from_chat({"messages": [{"role": "system", "content": "A"}, doc]})
    counting.encoded.clear()
    f = extractor.from_chat({"messages": [{"role": "system", "content": "B"}, doc]})
    assert counting.encoded == ["B"]
    prompt = codec.render_messages([{"role": "system", "content": "B"}, doc], True)
    assert list(f.page_hashes) == page_hashes(prompt, 16)


def test_edited_history_is_not_mistaken_for_the_cached_one(codec: ChatCodec) -> None:
    extractor = FeatureExtractor(codec, page_size=4)
    original = "x" * 40 + " original " + "y" * 40
    edited = "x" * 40 + " modified " + "y" * 40  # same length and ends: same cache fingerprint
    for content in (original, edited, original):
        messages = [
            {"role": "user", "content": content},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "next"},
        ]
        for k in (1, 3):
            f = extractor.from_chat({"messages": messages[:k]})
            prompt = codec.render_messages(messages[:k], add_generation_prompt=True)
            assert list(f.page_hashes) == page_hashes(prompt, 4)


def test_caches_are_bounded(codec: ChatCodec) -> None:
    extractor = FeatureExtractor(codec, page_size=16, cache_entries=8)
    for i in range(50):
        extractor.from_chat({"messages": [{"role": "user", "content": f"question {i}"}]})
    assert len(extractor._runs) <= 8 and len(extractor._prefixes) <= 8 and len(extractor._tips) <= 8


def test_keep_text_off(codec: ChatCodec) -> None:
    extractor = FeatureExtractor(codec, keep_text=False)
    assert extractor.from_chat({"messages": [{"role": "user", "content": "x"}]}).text == ""
    assert extractor.from_completion({"prompt": "x"}).text == ""


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"prompt": "hi"}, "hi"),
        ({"prompt": ["hi", "ignored"]}, "hi"),
        ({"prompt": [5, 6, 7]}, None),
        ({"prompt": [[5, 6, 7], [8]]}, None),
    ],
)
def test_completion_prompt_forms(
    codec: ChatCodec, body: dict[str, Any], expected: str | None
) -> None:
    extractor = FeatureExtractor(codec, page_size=2)
    f = extractor.from_completion(body)
    ids = codec.encode("hi") if expected else [5, 6, 7]
    assert f.prompt_len == len(ids)
    assert list(f.page_hashes) == page_hashes(ids, 2)
    assert (f.turn, f.est_hit, f.text) == (None, 0, expected or "")
    assert extractor.prompt_token_ids(body) == ids


def test_generate_prompt_forms(codec: ChatCodec) -> None:
    extractor = FeatureExtractor(codec, page_size=2)
    assert extractor.from_generate({"text": "abc"}).prompt_len == len(codec.encode("abc"))
    assert extractor.from_generate({"text": ["abc", "zz"]}).prompt_len == len(codec.encode("abc"))
    assert extractor.from_generate({"input_ids": [[1, 2, 3, 4], [9]]}).prompt_len == 4
    assert extractor.prompt_token_ids({"input_ids": [7, 8]}) == [7, 8]


def test_hints_from_headers_and_body(codec: ChatCodec) -> None:
    extractor = FeatureExtractor(codec)
    f = extractor.from_generate(
        {"text": "a"}, {"X-Smetric-Turn": "3", "x-smetric-history-tokens": "900"}
    )
    assert (f.turn, f.est_hit) == (3, 900)
    f = extractor.from_completion({"prompt": "a"}, {"x-smetric-turn": "0"})
    assert (f.turn, f.est_hit) == (0, 0)
    body: dict[str, Any] = {"prompt": "a", "smetric": {"turn": 2, "history_tokens": 64}}
    f = extractor.from_completion(body, {"x-smetric-turn": "9"})
    assert (f.turn, f.est_hit) == (2, 64)  # the body field wins over headers
    assert strip_hint(body) is True
    assert body == {"prompt": "a"}
    assert strip_hint(body) is False


@pytest.mark.parametrize(
    ("kind", "body", "headers", "message"),
    [
        ("chat", {}, None, "'messages'"),
        ("chat", {"messages": []}, None, "'messages'"),
        ("chat", {"messages": [{"role": "user", "content": 1}]}, None, r"messages\[0\]"),
        ("completion", {}, None, "'prompt'"),
        ("completion", {"prompt": 3}, None, "'prompt'"),
        ("completion", {"prompt": []}, None, "'prompt'"),
        ("completion", {"prompt": [1, -2]}, None, "'prompt'"),
        ("completion", {"prompt": [True]}, None, "'prompt'"),
        ("generate", {}, None, "'text' or 'input_ids'"),
        ("generate", {"text": "a", "input_ids": [1]}, None, "'text' or 'input_ids'"),
        ("generate", {"input_embeds": [[0.1]]}, None, "input_embeds"),
        ("generate", {"text": [1, 2]}, None, "'text"),
        ("generate", {"input_ids": "abc"}, None, "'input_ids'"),
        ("generate", {"text": "a"}, {"x-smetric-turn": "x"}, "x-smetric-turn"),
        ("generate", {"text": "a"}, {"x-smetric-history-tokens": "-1"}, "history-tokens"),
        ("generate", {"text": "a", "smetric": 3}, None, "'smetric'"),
        ("generate", {"text": "a", "smetric": {"turn": True}}, None, "smetric.turn"),
    ],
)
def test_errors(
    codec: ChatCodec, kind: str, body: dict[str, Any], headers: dict[str, str] | None, message: str
) -> None:
    extractor = FeatureExtractor(codec)
    with pytest.raises(FeatureError, match=message):
        if kind == "chat":
            extractor.from_chat(body)
        elif kind == "completion":
            extractor.from_completion(body, headers)
        else:
            extractor.from_generate(body, headers)
