"""`python -m smetric_router.patches apply|check|revert` (see `smetric_router.patches.cli`)."""

from smetric_router.patches.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
