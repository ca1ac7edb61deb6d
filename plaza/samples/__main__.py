"""``python -m plaza.samples``: see plaza.samples.cli."""

from __future__ import annotations

import sys

from plaza.samples.cli import main

sys.exit(main())
