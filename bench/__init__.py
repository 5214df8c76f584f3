"""Benchmarks and the end-to-end demo (``make bench``, ``make demo``).

- :mod:`bench.throughput`: exactly-once vs at-least-once vs a bare loop, as ratios
  measured in one run on one broker over the same input (docs/benchmarks.md).
- :mod:`bench.demo`: two replicas on the local broker, live counters, then the
  exactly-once verdict (docs/demo.md).
"""
