"""The emulated SGLang worker: a test and benchmark tool that speaks SGLang 0.5.23's HTTP surface
and KV-event feed over the engine model, so the router can be exercised without GPUs. It runs no
model.
"""
