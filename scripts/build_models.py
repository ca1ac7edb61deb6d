#!/usr/bin/env python
"""Build Plaza's sample model repository: a thin caller of ``python -m plaza.samples``.

    python scripts/build_models.py [--repository model_repository] [--source DIR] [--force]
                                   [--models a,b]

The builder itself is the package ``plaza.samples`` (see docs/models.md).
"""

from __future__ import annotations

import sys

from plaza.samples.cli import main

if __name__ == "__main__":
    sys.exit(main())
