"""Worker discovery: turn a source of workers (Kubernetes pods, a file) into the same add/remove
path as POST/DELETE /workers.

- base.py: what a provider hands over (the workers it wants now) and the diff into changes;
- selectors.py: `key=value` label selectors, parsed strictly;
- pods.py: pod -> worker decision (pure) and the pod table behind the Kubernetes provider;
- kubernetes.py: list + watch of pods (kubernetes_asyncio, imported only when used);
- file.py: a JSON or YAML list of workers, re-read when it changes;
- metrics.py: smetric_discovery_*;
- register.py: the one place discovered changes reach the worker registry.
"""
