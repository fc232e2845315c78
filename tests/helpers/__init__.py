"""Helpers the tests share: reading Prometheus text (`prometheus`), polling a condition
(`polling`)."""
