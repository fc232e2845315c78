"""Load generators that drive a router over HTTP (used by the end-to-end tests and benchmarks)."""
