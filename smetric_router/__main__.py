"""`python -m smetric_router`: the router (see `smetric_router.router.cli`)."""

from smetric_router.router.cli import main

if __name__ == "__main__":
    main()
