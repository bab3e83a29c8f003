"""``python -m sparkpoint``: the CLI (also what ``spark-submit .../sparkpoint/__main__.py run
JOB`` runs)."""

import sys

from sparkpoint.cli import main

if __name__ == "__main__":
    sys.exit(main())
