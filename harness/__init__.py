"""The suite's harness: what the tiers share, beside them in the repository and never in the wheel.

One folder per job, each importing only the folders below it (pyproject.toml's import-linter contract, checked by
tests_harness/test_layout.py):

    __main__, report, gpu_check, release   the command line and the jobs that span rooms
    audit/                                 the suite measuring itself (false alarms, gate rates, mutants, ...)
    gate/  serving/  counts/               the version-bump gate; fastpath in a server; exact work counts
    nightly/                               the nightly speed history
    speed/  quality/                       per-change speed; judged speech and its statistics
    parity/                                recording and comparing generations
    model/                                 the test checkpoint, its codec, the operating points
    run/                                   machine, results files, progress, strict inputs, workers

Everything reads the repository through `REPO_ROOT`.
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
