"""The one error the feature extractor raises for a malformed request."""

from __future__ import annotations


class FeatureError(ValueError):
    """A request field is missing or ill-typed; the message is OpenAI-style, for an HTTP 400."""
