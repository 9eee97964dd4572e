"""``python -m hotpaths`` runs the command-line tool."""

import sys

from hotpaths.harness.cli import main

if __name__ == "__main__":
    sys.exit(main())
