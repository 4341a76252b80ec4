"""`python -m benchmarks.soak` (`make soak`)."""

import sys

from benchmarks.soak.cli import main

sys.exit(main())
