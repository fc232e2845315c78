"""Helpers the tests share: reading Prometheus text (`prometheus`), polling a condition
(`polling`), building KV events (`kv_events`)."""
