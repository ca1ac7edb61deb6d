"""``python -m loadgen ...``: the load generator (the same as ``plaza loadgen ...``)."""

from __future__ import annotations

import sys

from plaza.loadgen.cli import run_loadgen_cli

if __name__ == "__main__":
    sys.exit(run_loadgen_cli())
