"""The benchmarks' Paddle halves: ``decode`` and ``dispatch`` (its inputs), imported by :mod:`graphjit.bench`
when a benchmark starts."""
