"""Latency Lab. Until the page lands (issue #6), `python app.py` starts the terminal chat."""

import sys

from engine.cli import main

if __name__ == "__main__":
    sys.exit(main())
