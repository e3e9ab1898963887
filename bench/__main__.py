"""`python -m bench` is the `bench` command."""

import sys

try:
    from bench.cli import main
except KeyboardInterrupt:  # Ctrl-C while the command line's modules load: the same one line as later on
    print("bench: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
