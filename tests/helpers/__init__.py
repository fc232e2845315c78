"""Helpers the tests share: reading Prometheus text (`prometheus`), polling a condition
(`polling`), building KV events (`kv_events`), reading flags back from --help and docs tables
(`flag_docs`), the order of the suite (`groups`)."""
