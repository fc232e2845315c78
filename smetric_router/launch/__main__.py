import sys

from smetric_router.launch.cli import main

sys.exit(main())
