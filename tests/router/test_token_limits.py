"""The completion budget a body asks for, and the context it is held to (router/token_limits.py,
Router.context_length): parsed as SGLang reads them."""

from __future__ import annotations

from typing import Any, cast

import aiohttp
import pytest

from smetric_router.policies import PolicyParams, make_policy
from smetric_router.router.errors import RouterError
from smetric_router.router.metrics import RouterMetrics
from smetric_router.router.routing import Features, Router
from smetric_router.router.token_limits import check_budget, check_total, requested_tokens
from smetric_router.router.workers import Worker, WorkerRegistry, context_length_of


@pytest.mark.parametrize(
    ("endpoint", "body", "asked"),
    [
        ("/v1/chat/completions", {}, None),
        ("/v1/chat/completions", {"max_tokens": 5}, ("max_tokens", 5)),
        ("/v1/chat/completions", {"max_completion_tokens": 7, "max_tokens": 5},
         ("max_completion_tokens", 7)),
        # SGLang reads `max_completion_tokens or max_tokens`: a 0 falls through
        ("/v1/chat/completions", {"max_completion_tokens": 0, "max_tokens": 5},
         ("max_tokens", 5)),
        ("/v1/completions", {"max_tokens": 1e9}, ("max_tokens", 10**9)),
        ("/v1/completions", {"max_completion_tokens": 3}, None),
        ("/generate", {"sampling_params": {"max_new_tokens": 2.0}}, ("max_new_tokens", 2)),
        ("/generate", {"sampling_params": [{"max_new_tokens": 2}, {}, {"max_new_tokens": 9}]},
         ("max_new_tokens", 9)),
        ("/generate", {"max_new_tokens": 9}, None),
    ],
)  # fmt: skip
def test_the_budget_asked(endpoint: str, body: dict[str, Any], asked: Any) -> None:
    assert requested_tokens(endpoint, body) == asked


@pytest.mark.parametrize("bad", [-1, 0.5, "8", True, [8], float("nan")])
def test_a_budget_that_is_no_count_is_refused(bad: object) -> None:
    with pytest.raises(RouterError) as e:
        requested_tokens("/v1/completions", {"max_tokens": bad})
    assert e.value.status == 400 and e.value.param == "max_tokens"


def test_checks_against_the_context() -> None:
    check_budget(("max_tokens", 100), 100)
    check_budget(("max_tokens", 10**9), None)  # unknown context: no limit
    with pytest.raises(RouterError, match="max_tokens is too large: 101"):
        check_budget(("max_tokens", 101), 100)
    check_total(("max_tokens", 60), 40, 100)
    with pytest.raises(RouterError, match="You requested a total of 101 tokens: 41 tokens"):
        check_total(("max_tokens", 60), 41, 100)


def no_features(page_size: int) -> Features:
    raise AssertionError("a context length is found without reading a request")


def test_the_context_is_the_smallest_reported_or_the_override() -> None:
    assert context_length_of({"data": [{"id": "lora", "max_model_len": None},
                                       {"id": "m", "max_model_len": 4096}]}) == 4096  # fmt: skip
    assert context_length_of({"data": [{"id": "m"}]}) is None
    assert context_length_of(None) is None
    registry = WorkerRegistry(session=cast(aiohttp.ClientSession, None))  # never used: no polling
    fleet = [("http://a:1", 8192, "m"), ("http://b:1", 4096, "m"), ("http://c:1", 1024, "other"),
             ("http://d:1", None, "m")]  # fmt: skip
    for url, context, model in fleet:
        registry.workers[url] = Worker(url, context_length=context, models=frozenset({model}))

    def router(override: int | None = None) -> Router:
        policy = make_policy("smetric", PolicyParams())
        metrics = RouterMetrics(lambda: [], None)
        return Router(policy, registry, metrics, no_features, context_length=override)

    assert router().context_length("m") == 4096
    assert router().context_length("other") == 1024
    assert router(32768).context_length("m") == 32768
    registry.workers.clear()
    assert router().context_length("m") is None
