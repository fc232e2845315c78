"""Checks of the README and the docs/ pages against the repository."""
