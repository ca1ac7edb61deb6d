"""The benchmark suite (``make bench`` = ``python -m plaza.loadgen.bench``; not in make test).

- ``runner``: the command line; runs the chosen benchmarks on one set of services.
- ``context``: what the benchmarks share (services, processes, folders) and the helpers for
  side-by-side measurement (interleaved rounds, paired ratios, CPU accounting).
- ``cases``: the benchmarks themselves, each returning a JSON-able report.
"""
