"""Admission control: requests wait at the router while their worker (or, for a first turn, the
cluster) has no room, follow-ups of running sessions ahead of new sessions (docs/admission.md)."""
