"""A RouterState from a RouterConfig, with the real parts: tokenizer, features, KV events."""

from __future__ import annotations

from smetric_router.cluster.kv_index import KvIndex
from smetric_router.cluster.subscriber import KvEventHub
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

    def features_for(page_size: int) -> FeatureExtractor:
        return FeatureExtractor(chat, page_size=page_size, keep_text=keep_text)

    # Probe mode asks the workers per request, so it needs neither the index nor its feeds.
    index = KvIndex() if config.cache_view == "events" else None
    return RouterState(
        config,
        features_for=features_for,
        hits=index,
        text_tree=TextTree() if keep_text else None,
        kv_feeds=KvEventHub(index) if index is not None and config.kv_events else None,
    )
