from __future__ import annotations

import random
import time

from smetric_router.cluster.text_tree import TextTree


def test_match_credits_each_worker_with_its_own_depth() -> None:
    t = TextTree()
    t.insert("hello world", "a")
    t.insert("hello there", "b")
    assert t.match("hello world, again") == {"a": 11, "b": 6}
    assert t.match("hello thx") == {"a": 6, "b": 8}
    assert t.match("goodbye") == {"a": 0, "b": 0}
    assert t.match("") == {"a": 0, "b": 0}
    assert (t.size("a"), t.size("b"), t.size("c")) == (11, 11, 0)


def test_reinsert_and_prefix_insert_do_not_grow_size() -> None:
    t = TextTree()
    t.insert("abcdef", "a")
    t.insert("abcdef", "a")
    t.insert("abc", "a")  # splits the edge; the worker still holds 6 chars
    assert t.size("a") == 6
    t.insert("abc", "b")
    assert t.match("abcdef") == {"a": 6, "b": 3}
    assert t.size("b") == 3


def test_lru_eviction_keeps_worker_under_max_size() -> None:
    t = TextTree(max_size=20, evict_to=0.5)
    t.insert("aaaaaaaa", "w")
    t.insert("bbbbbbbb", "w")
    t.insert("aaaaaaaa", "w")  # refreshes "a": "b" is now the least recent
    t.insert("bbbbbbbb", "x")  # another worker's copy is not touched by w's eviction
    t.insert("cccccccc", "w")  # 24 chars > 20: evict down to 10
    assert t.size("w") <= 10
    got = t.match("bbbbbbbb")
    assert got["w"] == 0 and got["x"] == 8
    assert t.match("cccccccc")["w"] == 8
    assert t.match("aaaaaaaa")["w"] == 0  # evicted next, as the older of the two left


def test_eviction_trims_the_tail_of_a_long_path_first() -> None:
    t = TextTree(max_size=10, evict_to=1.0)
    t.insert("prefix-one", "w")
    t.insert("prefix-two", "w")  # shares "prefix-"; 13 chars held
    assert t.size("w") <= 10
    assert t.match("prefix-two")["w"] == 10
    assert t.match("prefix-one")["w"] == len("prefix-")


def test_remove_worker_forgets_it() -> None:
    t = TextTree()
    t.insert("shared text", "a")
    t.insert("shared text", "b")
    t.remove_worker("a")
    assert t.match("shared text") == {"b": 11}
    t.remove_worker("b")
    assert t.match("shared text") == {}
    assert t.workers() == []


def brute_match(texts: set[str], q: str) -> int:
    def common(s: str) -> int:
        pairs = enumerate(zip(s, q, strict=False))
        return next((i for i, (a, b) in pairs if a != b), min(len(s), len(q)))

    return max(map(common, texts), default=0)


def test_matches_brute_force_without_eviction() -> None:
    rng = random.Random(5)
    t = TextTree()
    held: dict[str, set[str]] = {f"w{i}": set() for i in range(6)}

    def text() -> str:
        return "".join(rng.choice("ab") for _ in range(rng.randint(0, 12)))

    for _ in range(600):
        w = rng.choice(list(held))
        s = text()
        t.insert(s, w)
        held[w].add(s)
        q = text()
        got = t.match(q)
        for name, texts in held.items():
            if texts:
                assert got[name] == brute_match(texts, q)
    for name, texts in held.items():
        prefixes = {s[:i] for s in texts for i in range(1, len(s) + 1)}
        assert t.size(name) == len(prefixes)


def test_bounded_and_never_credits_text_never_inserted() -> None:
    rng = random.Random(9)
    t = TextTree(max_size=200, evict_to=0.8)
    held: dict[str, set[str]] = {f"w{i}": set() for i in range(4)}
    for _ in range(800):
        w = rng.choice(list(held))
        s = "".join(rng.choice("abc") for _ in range(rng.randint(1, 40)))
        t.insert(s, w)
        held[w].add(s)
        assert t.size(w) <= 200
        q = "".join(rng.choice("abc") for _ in range(30))
        for name, n in t.match(q).items():
            assert n <= brute_match(held[name], q)
        assert t.match(s)[w] > 0  # the text just inserted is the most recent: never evicted first


def test_long_prompts_are_fast() -> None:
    rng = random.Random(1)
    system = "".join(rng.choice("abcdefgh ") for _ in range(20000))
    t = TextTree()
    for i in range(32):
        t.insert(system + f"user {i}: " + "x" * 50000, f"w{i}")
    q = system + "user 7: " + "x" * 60000
    t0 = time.perf_counter()
    got = t.match(q)
    elapsed = time.perf_counter() - t0
    assert got["w7"] == len(system) + len("user 7: ") + 50000
    assert got["w3"] == len(system) + len("user ")
    assert elapsed < 0.01, elapsed
