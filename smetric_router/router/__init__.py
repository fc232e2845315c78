"""The router process: HTTP API, proxying, accounting, metrics, CLI.

    smetric-router --worker-urls http://w1:30001 http://w2:30001 --policy smetric
    smetric-router --pd-disaggregation --prefill http://p1:30001 8998 --decode http://d1:30002

Endpoints: POST /v1/chat/completions, /v1/completions, /generate (proxied; every reply carries
x-smetric-worker and x-smetric-reason); GET /v1/models (union of the workers' models); GET /health
(router alive), /readiness (200 when a request can be served: a healthy worker, or under PD a
healthy prefill and decode); GET /metrics; GET/POST/DELETE /workers (list; add {"url"}, under PD
with "role"; remove {"url"} or ?url=); /flush_cache (fanned out to all workers).

Under PD, replies also carry x-smetric-prefill-worker (x-smetric-worker names the decode).

Modules: cli (flags -> config.RouterConfig), app (routes, RouterState), routing (features ->
view -> decision), proxy (forwarding, streaming, retries), pd (prefill/decode pair dispatch),
workers (registry, roles, health, load), metrics (Prometheus), errors (OpenAI-style bodies), kv
(what is needed of the KV-event hub), probe (--cache-view probe: hits asked of the workers'
/smetric/prefix_match instead of the KV-event index), assemble (the real parts wired together).
"""
