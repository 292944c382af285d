"""The benchmarks' torch halves: ``decode``, ``train``, ``hf``, ``allreduce`` (the workers) and ``dispatch``
(its inputs), imported by :mod:`graphjit.bench` when a benchmark starts."""
