"""The router process: HTTP API, proxying, accounting, metrics, CLI."""
