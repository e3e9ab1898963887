"""`python -m bench` is the `bench` command."""

import os
import sys

try:
    os.getcwd()
except FileNotFoundError:  # the folder it was started from was deleted: every import and relative path would fail
    print("bench: error: the current folder no longer exists (it was deleted or moved); cd to an existing folder "
          "and run the command again", file=sys.stderr)
    sys.exit(2)

try:
    from bench.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line's modules load: the same one line as later on
    print("bench: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
