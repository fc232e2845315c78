"""GET /metrics: a cheap subset of SGLang's Prometheus names, read from the runner per scrape."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from smetric_router.emulator.runner import EngineRunner

_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")


class _RunnerCollector(Collector):
    def __init__(self, runner: EngineRunner, model_name: str) -> None:
        self._runner = runner
        self._label_values = [model_name, "unified", "0", "0", "0"]

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(f"sglang:{name}", doc, labels=_LABELS)
        g.add_metric(self._label_values, value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(f"sglang:{name}", doc, labels=_LABELS)
        c.add_metric(self._label_values, value)
        return c

    def collect(self) -> Iterator[Metric]:
        load = self._runner.engine.load()
        c = self._runner.counters
        cfg = self._runner.engine.config
        yield self._gauge("num_running_reqs", "Running requests", load.num_running_reqs)
        yield self._gauge("num_queue_reqs", "Waiting requests", load.num_waiting_reqs)
        yield self._gauge("num_used_tokens", "KV tokens in use", load.num_used_tokens)
        yield self._gauge("token_usage", "KV token usage", load.token_usage)
        yield self._gauge("cache_hit_rate", "Prefix cache hit rate", load.cache_hit_rate)
        yield self._gauge("gen_throughput", "Generation throughput (tok/s)", load.gen_throughput)
        yield self._gauge("max_total_num_tokens", "KV capacity", load.max_total_num_tokens)
        yield self._gauge("page_size", "KV page size", cfg.page_size)
        yield self._counter("num_requests", "Requests received", c.requests)
        yield self._counter("prompt_tokens", "Prompt tokens", c.prompt_tokens)
        yield self._counter("generation_tokens", "Generated tokens", c.generation_tokens)
        yield self._counter("cached_tokens", "Prompt tokens served from cache", c.cached_tokens)


def make_registry(runner: EngineRunner, model_name: str) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_RunnerCollector(runner, model_name))
    return registry
