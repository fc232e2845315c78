"""Turn, est_hit, hints, errors, cache reuse and incremental ids and page hashes of the extractor.

Equality with SGLang's own rendering is tests/features/test_golden_sglang.py; here the
incremental path is checked against the extractor's own cold path (a fresh extractor tokenizes
the whole rendered prompt) and the rendered text against hand-written expectations.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from smetric_router.features.chat_prompt import _peek
from smetric_router.features.chat_tokenizer import ChatTokenizer, load_chat_tokenizer
from smetric_router.features.errors import FeatureError
from smetric_router.features.extract import FeatureExtractor, strip_hint
from smetric_router.features.hashing import page_hashes
from smetric_router.features.rendered import MAX_DEPTH, common_prefix
from smetric_router.features.sample_text import TextSampler

Message = dict[str, Any]
ASSETS = Path(__file__).resolve().parents[2] / "smetric_router" / "assets"
CODER = str(ASSETS / "tiny_model" / "chat_template.jinja")
THINKING = str(Path(__file__).parent / "templates" / "qwen3_thinking.jinja")
TEMPLATES = {"chatml": None, "coder": CODER, "thinking": THINKING}
PATH = {"type": "object", "properties": {"path": {"type": "string"}}}
TOOLS = [
    {"type": "function", "function": {"name": "read", "description": "Read", "parameters": PATH}}
]


@pytest.fixture(scope="module")
def chat() -> ChatTokenizer:
    return load_chat_tokenizer()


@pytest.fixture(scope="module")
def sampler(chat: ChatTokenizer) -> TextSampler:
    """Text that tokenizes to a known number of tokens."""
    return TextSampler(chat.tokenizer.backend)


def cold_ids(chat: ChatTokenizer, body: dict[str, Any]) -> list[int]:
    """The whole rendered prompt tokenized at once, by a fresh extractor."""
    return FeatureExtractor(chat).prompt_token_ids(body)


def agent_turns(sampler: TextSampler, n_turns: int, seed: int) -> list[list[Message]]:
    """The message list of each request of one agent session: the first request, then each
    follow-up appending the previous reply (text or tool call) and a new user/tool message."""
    rng = random.Random(seed)
    messages: list[Message] = [
        {"role": "system", "content": "You are an agent. " * rng.randint(1, 30)},
        {"role": "user", "content": sampler.sample(rng.randint(1, 60), seed)[0]},
    ]
    requests = [list(messages)]
    for turn in range(n_turns):
        if rng.random() < 0.5:
            call = {
                "id": f"c{turn}",
                "type": "function",
                "function": {"name": "read", "arguments": '{"path": "a.py"}'},
            }
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            content: Any = "\n    " + sampler.sample(rng.randint(0, 90), seed + turn)[0]
            messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": content})
        else:
            reply = sampler.sample(rng.randint(1, 50), seed + turn)[0]
            messages.append(
                {"role": "assistant", "content": reply, "reasoning_content": f"think {turn}"}
            )
            parts = [{"type": "text", "text": "  next "}, {"type": "text", "text": str(turn)}]
            messages.append({"role": "user", "content": parts})
        requests.append(list(messages))
    return requests


def test_first_turn(chat: ChatTokenizer) -> None:
    extractor = FeatureExtractor(chat, page_size=4)
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
    f = extractor.from_chat(body)
    text = "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    prompt = chat.tokenizer.encode_chat(text)
    assert f.text == text
    assert (f.turn, f.est_hit, f.prompt_len, f.model) == (0, 0, len(prompt), "m")
    assert list(f.page_hashes) == page_hashes(prompt, 4)
    assert extractor.prompt_token_ids(body) == prompt


def test_content_is_tokenized_with_its_surroundings(chat: ChatTokenizer) -> None:
    """'\\n' + '  x' merges across the role line when the prompt is tokenized whole, as SGLang
    does it, so tokenizing the pieces apart would give other ids."""
    messages = [{"role": "user", "content": "  x"}]
    ids = FeatureExtractor(chat).prompt_token_ids({"messages": messages})
    whole = "<|im_start|>user\n  x<|im_end|>\n<|im_start|>assistant\n"
    assert ids == chat.tokenizer.encode_chat(whole)
    enc = chat.tokenizer.encode_chat
    start, end = enc("<|im_start|>"), enc("<|im_end|>")
    piecewise = [*start, *enc("user\n"), *enc("  x"), *end, *enc("\n"), *start, *enc("assistant\n")]
    assert ids != piecewise


def test_follow_up_turn_and_est_hit(chat: ChatTokenizer) -> None:
    extractor = FeatureExtractor(chat, page_size=16)
    first: list[Message] = [{"role": "user", "content": "list the files"}]
    extractor.from_chat({"messages": first})
    follow_up = [*first, {"role": "assistant", "content": "a.py b.py"},
                 {"role": "user", "content": "ok"}]  # fmt: skip
    f = extractor.from_chat({"messages": follow_up})
    history = (
        "<|im_start|>user\nlist the files<|im_end|>\n<|im_start|>assistant\na.py b.py<|im_end|>"
    )
    assert f.turn == 1
    # est_hit: the conversation through the reply's <|im_end|> (what the worker cached)
    assert f.est_hit == len(chat.tokenizer.encode_chat(history))
    assert f.prompt_len == len(cold_ids(chat, {"messages": follow_up}))


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_incremental_ids_equal_the_whole_prompt_tokenized(
    sampler: TextSampler, template: str
) -> None:
    chat = load_chat_tokenizer(None, TEMPLATES[template])
    for page_size in (1, 5, 16):
        extractor = FeatureExtractor(chat, page_size=page_size, cache_entries=64)
        for seed in range(3):
            for turn, messages in enumerate(agent_turns(sampler, 6, seed * 10 + page_size)):
                # a fresh parse each time, as the router sees it: no object is shared with the
                # previous turn's request
                body = orjson.loads(orjson.dumps({"messages": messages, "tools": TOOLS}))
                f = extractor.from_chat(body)
                want = cold_ids(chat, body)
                assert list(f.page_hashes) == page_hashes(want, page_size)
                assert f.prompt_len == len(want)
                assert f.turn == turn
                assert 0 <= f.est_hit <= f.prompt_len


def test_conversations_read_from_several_threads_get_the_features_read_alone(
    chat: ChatTokenizer, sampler: TextSampler
) -> None:
    """One extractor, four threads, each reading its conversations turn by turn while the
    others do: every request's features are those a fresh extractor gives it alone."""
    shared = FeatureExtractor(chat, page_size=16, cache_entries=8)  # small: entries churn
    sessions = [agent_turns(sampler, 5, seed) for seed in range(12)]
    start = threading.Barrier(4)

    def read(mine: list[list[list[Message]]]) -> list[tuple[Any, ...]]:
        start.wait()
        out = []
        for turns in mine:
            for messages in turns:
                f = shared.from_chat(orjson.loads(orjson.dumps({"messages": messages})))
                out.append((list(f.page_hashes), f.prompt_len, f.turn, f.est_hit))
        return out

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(read, [sessions[i::4] for i in range(4)]))
    for i in range(4):
        want = []
        for turns in sessions[i::4]:
            alone = FeatureExtractor(chat, page_size=16)
            for messages in turns:
                f = alone.from_chat({"messages": messages})
                want.append((list(f.page_hashes), f.prompt_len, f.turn, f.est_hit))
        assert got[i] == want


class Spy:
    """Records the texts the extractor tokenizes (its tokenizer's encode_chat, wrapped for the
    test)."""

    def __init__(self, chat: ChatTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.texts: list[str] = []
        original = chat.tokenizer.encode_chat

        def encode_chat(text: str, *budget: Any) -> list[int]:
            self.texts.append(text)
            return original(text, *budget)

        monkeypatch.setattr(chat.tokenizer, "encode_chat", encode_chat)


def test_follow_up_tokenizes_only_what_follows_the_previous_prompt(
    sampler: TextSampler, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat = load_chat_tokenizer(None, CODER)
    extractor = FeatureExtractor(chat, page_size=16)
    spy = Spy(chat, monkeypatch)
    requests = agent_turns(sampler, 4, seed=5)
    extractor.from_chat({"messages": requests[-2], "tools": TOOLS})
    spy.texts.clear()
    f = extractor.from_chat({"messages": requests[-1], "tools": TOOLS})
    # the previous prompt ended "<|im_start|>assistant\n": the text after that <|im_start|>
    assert len(spy.texts) == 1
    assert f.text.endswith(spy.texts[0]) and spy.texts[0].startswith("assistant\n")
    spy.texts.clear()
    extractor.from_chat({"messages": requests[-1], "tools": TOOLS})  # a retry: nothing new
    assert spy.texts == []


def test_a_follow_up_many_turns_on_tokenizes_only_the_turns_since(
    sampler: TextSampler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a router replica sees it: the conversation's last requests went to other replicas."""
    chat = load_chat_tokenizer(None, CODER)
    extractor = FeatureExtractor(chat, page_size=16)
    spy = Spy(chat, monkeypatch)
    requests = agent_turns(sampler, 7, seed=11)
    assert len(requests[-1]) - len(requests[1]) > 8  # beyond the look-back over appended ones
    seen = extractor.from_chat({"messages": requests[1], "tools": TOOLS})
    other = [requests[0][0], {"role": "user", "content": "another task"}]
    extractor.from_chat({"messages": other, "tools": TOOLS})  # the same system prompt, last
    spy.texts.clear()
    body = {"messages": requests[-1], "tools": TOOLS}
    f = extractor.from_chat(body)
    assert spy.texts and sum(map(len, spy.texts)) < len(f.text) - len(seen.text) + 64
    assert list(f.page_hashes) == page_hashes(cold_ids(chat, body), 16)
    assert (f.turn, f.est_hit) == (
        (g := FeatureExtractor(chat, page_size=16).from_chat(body)).turn,
        g.est_hit,
    )


def test_rewritten_earlier_turn_is_retokenized_from_the_rewrite(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The thinking template drops an answered turn's reasoning once a user turn follows."""
    chat = load_chat_tokenizer(None, THINKING)
    extractor = FeatureExtractor(chat, page_size=4)
    spy = Spy(chat, monkeypatch)
    call = {"id": "c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    messages: list[Message] = [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": "", "reasoning_content": "why", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "a.py"},
    ]
    before = extractor.from_chat({"messages": messages})
    assert "<think>\nwhy\n</think>" in before.text  # after the last user query: kept
    spy.texts.clear()
    body = {"messages": [*messages, {"role": "user", "content": "next"}]}
    f = extractor.from_chat(body)
    assert "<think>" not in f.text  # a user query follows it now: dropped
    turn = f.text.index("<|im_start|>assistant\n<tool_call>")
    assert spy.texts == [f.text[turn + len("<|im_start|>") :]]
    assert list(f.page_hashes) == page_hashes(cold_ids(chat, body), 4)
    # est_hit: rendered last, the turn keeps its reasoning; the text the two renderings share
    # ends in its role line, so the history ends at that turn's <|im_start|>
    assert f.est_hit == len(chat.tokenizer.encode_chat(f.text[: turn + len("<|im_start|>")]))


def test_tips_of_one_conversation_share_its_messages(
    chat: ChatTokenizer, sampler: TextSampler
) -> None:
    # Every request is parsed anew, yet the retained history is held once, not once per turn.
    extractor = FeatureExtractor(chat, page_size=16)
    requests = agent_turns(sampler, 6, seed=9)
    for messages in requests:
        extractor.from_chat(orjson.loads(orjson.dumps({"messages": messages})))
    kept = [tip.messages for tip in extractor._chats._tips._data.values()]
    assert len(kept) == len(requests)
    first = kept[0]
    assert all(later[i] is first[i] for later in kept[1:] for i in range(len(first)))


def test_new_session_reuses_the_shared_system_prompt(
    chat: ChatTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    extractor = FeatureExtractor(chat, page_size=16)
    spy = Spy(chat, monkeypatch)
    system = {"role": "system", "content": "You are a coding agent. " * 50}
    extractor.from_chat({"messages": [system, {"role": "user", "content": "task one"}]})
    spy.texts.clear()
    f = extractor.from_chat({"messages": [system, {"role": "user", "content": "task two"}]})
    assert spy.texts == ["user\ntask two<|im_end|>\n<|im_start|>assistant\n"]
    body = {"messages": [system, {"role": "user", "content": "task two"}]}
    assert list(f.page_hashes) == page_hashes(cold_ids(chat, body), 16)


def test_edited_history_is_not_mistaken_for_the_cached_one(chat: ChatTokenizer) -> None:
    extractor = FeatureExtractor(chat, page_size=4)
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
            want = cold_ids(chat, {"messages": messages[:k]})
            assert list(f.page_hashes) == page_hashes(want, 4)


def test_caches_are_bounded(chat: ChatTokenizer) -> None:
    extractor = FeatureExtractor(chat, page_size=16, cache_entries=8)
    for i in range(50):
        extractor.from_chat({"messages": [{"role": "user", "content": f"question {i}"}]})
    assert len(extractor._chats._tips) <= 8
    small = FeatureExtractor(chat, page_size=16, cache_bytes=20_000)
    for i in range(50):
        small.from_chat({"messages": [{"role": "user", "content": f"{i} " + "word " * 400}]})
    assert small._chats._tips.bytes <= 20_000 or len(small._chats._tips) == 1


def test_keep_text_off(chat: ChatTokenizer) -> None:
    extractor = FeatureExtractor(chat, keep_text=False)
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
    chat: ChatTokenizer, body: dict[str, Any], expected: str | None
) -> None:
    extractor = FeatureExtractor(chat, page_size=2)
    f = extractor.from_completion(body)
    ids = chat.tokenizer.encode_text("hi") if expected else [5, 6, 7]
    assert f.prompt_len == len(ids)
    assert list(f.page_hashes) == page_hashes(ids, 2)
    assert (f.turn, f.est_hit, f.text) == (None, 0, expected or "")
    assert extractor.prompt_token_ids(body) == ids


def test_generate_prompt_forms(chat: ChatTokenizer) -> None:
    extractor = FeatureExtractor(chat, page_size=2)
    abc = len(chat.tokenizer.encode_text("abc"))
    assert extractor.from_generate({"text": "abc"}).prompt_len == abc
    assert extractor.from_generate({"text": ["abc", "zz"]}).prompt_len == abc
    assert extractor.from_generate({"input_ids": [[1, 2, 3, 4], [9]]}).prompt_len == 4
    assert extractor.prompt_token_ids({"input_ids": [7, 8]}) == [7, 8]
    # special-token text in a raw prompt is the special token, as in SGLang
    assert extractor.prompt_token_ids({"text": "<|im_end|>"}) == [
        chat.tokenizer.backend.token_to_id("<|im_end|>")
    ]


def test_hints_from_headers_and_body(chat: ChatTokenizer) -> None:
    extractor = FeatureExtractor(chat)
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


BAD_CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}]}  # fmt: skip


BAD_CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}]}  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "body", "headers", "message"),
    [
        ("chat", {}, None, "'messages'"),
        ("chat", {"messages": []}, None, "'messages'"),
        ("chat", {"messages": [{"role": "user", "content": 1}]}, None, r"messages\[0\]"),
        ("chat", {"messages": ["hi"]}, None, r"messages\[0\]"),
        ("chat", {"messages": [{"content": "hi"}]}, None, r"messages\[0\]\.role"),
        ("chat", {"messages": [BAD_CALL]}, None, "must be valid JSON"),
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
    chat: ChatTokenizer, kind: str, body: dict[str, Any], headers: dict[str, str] | None,
    message: str,
) -> None:  # fmt: skip
    extractor = FeatureExtractor(chat)
    with pytest.raises(FeatureError, match=message):
        if kind == "chat":
            extractor.from_chat(body)
        elif kind == "completion":
            extractor.from_completion(body, headers)
        else:
            extractor.from_generate(body, headers)


def test_long_conversations_flatten_their_chains(chat: ChatTokenizer) -> None:
    """Each follow-up's prompt is stored as what it adds to the previous one; chains longer than
    MAX_DEPTH are flattened, and every prompt stays exact."""
    extractor = FeatureExtractor(chat, page_size=8)
    messages: list[Message] = [{"role": "user", "content": "start"}]
    depths = []
    for turn in range(MAX_DEPTH + 10):
        body = {"messages": list(messages)}
        f = extractor.from_chat(body)
        want = cold_ids(chat, body)
        assert list(f.page_hashes) == page_hashes(want, 8), turn
        assert extractor.prompt_token_ids(body) == want
        tip = extractor._chats._tips.get((len(messages), _peek(messages[-1])))
        assert tip is not None
        depths.append(tip.rendered.depth)
        messages += [{"role": "assistant", "content": f"  answer {turn}\n"},
                     {"role": "user", "content": f"\n question {turn}"}]  # fmt: skip
    assert max(depths) == MAX_DEPTH and depths[-1] < MAX_DEPTH


def test_a_first_turn_starts_from_a_short_flat_beginning(chat: ChatTokenizer) -> None:
    extractor = FeatureExtractor(chat, page_size=16)
    system = {"role": "system", "content": "rules " * 30_000}
    extractor.from_chat({"messages": [system, {"role": "user", "content": "one"}]})
    (start,) = extractor._chats._starts.values()
    assert start.parent is None and len(start.tail) <= 1 << 16
    body = {"messages": [system, {"role": "user", "content": "two"}]}
    assert extractor.prompt_token_ids(body) == cold_ids(chat, body)


def test_common_prefix_is_the_longest_shared_beginning() -> None:
    rng = random.Random(5)
    for _ in range(2000):
        a = "".join(rng.choice("ab") for _ in range(rng.randint(0, 12)))
        b = "".join(rng.choice("ab") for _ in range(rng.randint(0, 12)))
        start = rng.randint(0, len(a))
        rest = a[start:]
        expected = next(
            (i for i in range(min(len(rest), len(b))) if rest[i] != b[i]), min(len(rest), len(b))
        )
        assert common_prefix(a, b, start) == expected, (a, b, start)
