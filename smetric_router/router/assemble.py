"""A RouterState from a RouterConfig, with the real parts: tokenizer, features, KV events."""

from __future__ import annotations

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.cluster.l3_view import EventsL3, L3Config, MasterL3
from smetric_router.cluster.subscriber import FeedConfig, KvEventHub
from smetric_router.cluster.text_tree import TextTree
from smetric_router.features.chat_tokenizer import load_chat_tokenizer
from smetric_router.features.extract import FeatureExtractor
from smetric_router.policies import make_policy
from smetric_router.router.app import RouterState
from smetric_router.router.config import RouterConfig


def make_state(config: RouterConfig) -> RouterState:
    # fails fast on a bad --tokenizer-path or --chat-template
    chat = load_chat_tokenizer(config.tokenizer_path, config.chat_template)
    keep_text = make_policy(config.prefill_policy_name, config.policy_params).uses_text_tree

    keep_digests = config.l3_view == "master"  # the master is asked by SGLang's key names

    def features_for(page_size: int) -> FeatureExtractor:
        return FeatureExtractor(
            chat, page_size=page_size, keep_text=keep_text, keep_digests=keep_digests
        )

    # Probe mode asks the workers per request, so it needs neither the index nor its feeds.
    index = KvIndex() if config.cache_view == "events" else None
    l3: MasterL3 | EventsL3 | None = None
    if config.l3_view == "master":
        assert config.mooncake_master_url is not None
        l3 = MasterL3(
            L3Config(
                master_url=config.mooncake_master_url.rstrip("/"),
                tp_rank=config.l3_tp_rank,
                budget_s=config.l3_budget_secs,
                ttl_s=config.l3_cache_ttl_secs,
            )
        )
    elif config.l3_view == "events" and index is not None:
        l3 = EventsL3(index)
    feeds = None
    if index is not None and config.kv_events:
        feeds = KvEventHub(
            index,
            config=FeedConfig(
                trust_endpoints=config.trust_kv_endpoints,
                http_headers=tuple(config.worker_headers().items()),
            ),
        )
    return RouterState(
        config,
        features_for=features_for,
        hits=index,
        text_tree=TextTree() if keep_text else None,
        kv_feeds=feeds,
        l3=l3,
    )
