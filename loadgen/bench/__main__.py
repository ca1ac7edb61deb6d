"""``python -m plaza.loadgen.bench``: the benchmark suite's command line."""

import sys

from plaza.loadgen.bench.runner import main

sys.exit(main())
