"""`python -m invariants RUN_DIR [--golden DIR] [--json]`: same as `trainwreck check`."""

import sys

from trainwreck.invariants.cli import main

sys.exit(main())
