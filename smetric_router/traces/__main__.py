"""`python -m smetric_router.traces`: see `smetric_router.traces.cli`."""

from smetric_router.traces.cli import main

if __name__ == "__main__":
    main()
