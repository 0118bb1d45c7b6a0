"""Speed-tier support: who measured (machine), what was kept (baselines), and whether it got slower (compare).

- ``machine``: hardware and software description of this machine, and the device key that names its baseline.
- ``baselines``: the baseline file format (``baselines/<device_key>.json``), atomic save and strict load, and
  reading pytest-benchmark ``--benchmark-json`` files into the same per-point samples.
- ``compare``: the regression rule (median slowdown above a factor AND a one-sided Mann-Whitney U test), the
  per-point verdicts, and the ``fastpath-suite compare`` report CLI.

Nothing here imports torch or the model at import time.
"""
