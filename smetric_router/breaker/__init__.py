"""Circuit breaking: a worker whose dispatches keep failing is left alone for a cool-down, then
tried again with a few real requests, whatever its /health says (docs/production.md)."""
