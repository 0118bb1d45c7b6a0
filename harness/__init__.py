"""The suite's harness: what the tiers share, beside them in the repository and never in the wheel.

Stages, in the order a run uses them: `checkpoint` (build / find / load the model), `parity` (record and compare
generations), `speed` (measure, baselines, compare), `quality` (generate, judge, score, gate), `goldens` and
`gate` (upstream version bumps), `report` (`fastpath-suite report`). `machine` describes the machine once for
all of them. Everything reads the repository through `REPO_ROOT`.
"""

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# The distribution's name on the package index (the wheel, its metadata, pip): not the import package `fastpath`.
# (Read with a pattern, not tomllib: the suite runs on Python 3.10, which has none; tests_patches/test_package.py
# checks it against the built wheel's metadata.)
DISTRIBUTION = re.search(r'^name = "([^"]+)"', (REPO_ROOT / "pyproject.toml").read_text(), re.M).group(1)
FIXTURES = REPO_ROOT / "fixtures"
BASELINES = REPO_ROOT / "baselines"
