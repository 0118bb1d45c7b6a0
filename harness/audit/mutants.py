"""Mutation testing of what decides: how much of a change to `fastpath/`, or to the harness code that turns
measurements into verdicts, the suite's tests catch (the scope, room by room: harness.audit.mutant_rooms).

The engine is mutmut (3.8.1, pinned): it writes every mutant of a function beside the original behind a
trampoline, learns which tests call each function (its "stats" run), and runs each mutant against those tests
only, stopping at the first failure, in a process forked from a server that has imported torch once, with a limit
of CPU time per mutant. docs/mutants.md says why mutmut and not cosmic-ray, and how each figure is measured.

Stages of `fastpath-suite audit mutants`:

    prepare       a work folder (.cache/mutants/) per set of tests, holding this checkout's files and mutmut's
                  setup.cfg
    generate      every mutant of the scope's files, each with its room, function, the source line it changes and
                  its diff; a harness file keeps the mutants of its deciding functions only
    choose        a seeded sample (--sample N; the seed is derived from the commit measured unless --seed names
                  one), the mutants of the lines changed since a commit (--changed-since REF; `auto`: the merge base
                  with main, or the last commit on main itself; past --max-mutants they are named, not judged), or
                  the mutants only a GPU run can observe (--needs-gpu)
    run_mutants   `mutmut run NAME...` with progress (done, killed, survived, timed out, about how long is left)
    judge         the score: killed / (killed + survived) with its exact (Clopper-Pearson) 95% interval, every
                  survivor with its diff and the tests that ran, every timeout, per room and overall; mutants
                  listed in fixtures/mutants/equivalent.json (each with its reason) are left out, those in
                  needs_gpu.json are counted apart, and an entry that matches no mutant any more is an error

Exit status: 0 no survivor (or the score reaches --min-score), 1 a survivor (its diff and the command to run it
again are printed), 2 bad input (a stale equivalent, a base that does not resolve, mutmut's clean run failing),
3 not judged (mutants left unrun within --budget, or past --max-mutants).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.audit import mutant_rooms
from harness.audit.failures import ENV as FAILURES_ENV
from harness.run import strict
from harness.run.progress import Progress, clock

ROOT = Path(__file__).resolve().parents[2]
ENGINE = "mutmut==3.8.1"
# what the sample draws from: every file of every room (harness.audit.mutant_rooms)
MODULES = tuple(mutant_rooms.files(mutant_rooms.ROOMS))
TESTS = mutant_rooms.PATCH_TESTS  # the patches' tests (each room names its own)
EQUIVALENT = ROOT / "fixtures" / "mutants" / "equivalent.json"
# mutants only a run on a GPU can observe: counted apart, never in the CPU score, run by gpu-check on a device
NEEDS_GPU = ROOT / "fixtures" / "mutants" / "needs_gpu.json"
# seeds of samples whose survivors tests were then written against: such a sample is a training sample, never a
# headline (its runs go to the results kinds mutants-before and mutants-after)
TRAINING_SEEDS = ROOT / "fixtures" / "mutants" / "training_seeds.json"
# imported once by mutmut's fork server. Not fastpath, harness or the tests: the registry builds its table of
# patches at import, so each mutant's process imports them afresh with its mutant active.
PRELOAD = ("torch", "transformers", "omnivoice", "numpy", "scipy", "soundfile", "pytest")
# mutmut's exit codes per mutant -> what the score counts (mutmut.stats.status_by_exit_code)
KILLED, SURVIVED, TIMEOUT, NO_TESTS, OTHER = "killed", "survived", "timeout", "no tests", "not judged"
STATUS = {1: KILLED, 3: KILLED, -11: KILLED, -9: KILLED, 0: SURVIVED, 5: NO_TESTS, 33: NO_TESTS,
          36: TIMEOUT, 24: TIMEOUT, -24: TIMEOUT, 152: TIMEOUT, 255: TIMEOUT}
# functions that run when fastpath is imported (the registry's table of patches): mutmut's stats run credits their
# calls to whichever test imported fastpath first, so their mutants meet the wrong tests. One rule whatever the
# outcome: killed or survived, such a mutant is not judged, and listed
IMPORT_TIME = {("fastpath/registry.py", "_lazy"), ("fastpath/registry.py", "_loop"),
               ("fastpath/registry.py", "_register")}
MULTIPLIER, CONFIRM = 4, 3
# one thread per worker: two workers of torch's two threads on two cores ran tests_patches/test_registry.py in 80 s
# each, against 30 s at one thread each (and 25 s for one run alone), so mutants timed out that would have passed
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
COMPLETED = re.compile(r"Completed (\S+): exit=(-?\d+) \(([\d.]+)s\)")


class MutantsError(RuntimeError):
    """Bad input to the mutation run; the message names the fix."""


@dataclass
class Mutant:
    name: str  # mutmut's: fastpath.registry.x_apply__mutmut_12
    path: str  # fastpath/registry.py
    function: str  # apply, or PromptCache.put
    lines: list  # the source lines (1-based, this checkout) the mutant changes
    before: str  # the first changed line, stripped
    after: str  # what the mutant puts there, stripped ("" when it removes the line)
    diff: str
    status: str = ""
    seconds: float | None = None
    tests: list = field(default_factory=list)
    room: str = ""


# --- prepare --------------------------------------------------------------------------------------------------------

def work_folder() -> Path:
    from harness.model.checkpoint import cache_dir

    return cache_dir() / "mutants"


def prepare(work: Path, tests=TESTS, source: Path = ROOT, modules=MODULES, mark: str | None = None) -> Path:
    """A fresh work folder: this checkout's files (tracked and untracked, not ignored, as they are on disk) and a
    setup.cfg with mutmut's settings. mutmut writes its mutants/ there, never into the checkout."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=source, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = source / name
        if not src.is_file():
            continue  # deleted in the working tree
        dst = work / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    sources = sorted({Path(m).parts[0] for m in modules})  # fastpath, harness: mutmut copies and mutates these
    tops = sorted({Path(name).parts[0] for name in filter(None, listed) if (work / name).exists()}
                  - set(sources) - {"setup.cfg"})
    (work / "mutation-preload.txt").write_text("\n".join(PRELOAD) + "\n")
    lines = ["[mutmut]", "source_paths ="] + [f"    {p}" for p in sources]
    lines += ["only_mutate ="] + [f"    {m}" for m in modules]
    lines += ["also_copy ="] + [f"    {t}" for t in tops]
    lines += ["pytest_add_cli_args_test_selection ="] + [f"    {t}" for t in tests]
    # mutmut names the tests of a run from a set: harness.audit.in_order runs them in their files' order
    lines += ["pytest_add_cli_args =", "    -p", "    no:cacheprovider", "    -p", "    harness.audit.in_order",
              "    -p", "    harness.audit.child_calls",
              "    -p", "    harness.audit.failures",  # names a test that fails on the unmutated code (run_mutants)
              # a failure's long traceback reads the mutated file (mutmut's copy of gate.py is about 200,000 lines)
              # for every frame: half a minute per killed mutant, past the wall limit; the native one reads a line
              "    --tb=native"]
    lines += ["    -m", f"    {mark}"] if mark else []
    lines += [
              # torch: plain fork deadlocks in libgomp; the fork server forks from a process with no OpenMP team
              "process_isolation = forkserver", "forkserver_warmup = import",
              "preload_modules_file = mutation-preload.txt",
              # each mutant's run also pays pytest's session start (the shared-state record, module fixtures); a
              # mutant that hangs (a stream waiting for a worker it stopped) uses no CPU, so mutmut's wall limit,
              # (tests' time + constant) x multiplier, is what ends it: 4 instead of mutmut's 15 (a timeout is
              # confirmed alone at CONFIRM x that limit before it counts, run_mutants)
              "timeout_constant = 10", f"timeout_multiplier = {MULTIPLIER}", "log_to_file = true", ""]
    (work / "setup.cfg").write_text("\n".join(lines))
    return work


# --- generate -------------------------------------------------------------------------------------------------------

def generate(work: Path, modules=MODULES) -> list:
    """The mutants of `modules` in their deciding functions (mutmut's generation, in a child process in the work
    folder). The work folder's own harness runs it: a checkout of an older commit (`--source`, the budget's commits)
    may describe every mutant of its files, so callers still keep only what `mutant_rooms.decides`."""
    code = f"import harness.audit.mutants as m; m._generate_here({list(modules)!r})"
    done = subprocess.run([sys.executable, "-c", code], cwd=work,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise MutantsError(f"mutmut could not generate the mutants (exit {done.returncode}):\n"
                           f"{done.stderr[-3000:]}\ncheck that {ENGINE} is installed (scripts/install.sh)")
    return [Mutant(**row) for row in json.loads(done.stdout.splitlines()[-1])]


# A process a test starts (a child pytest, `python -m harness`) imports the mutated code from mutants/ (its
# PYTHONPATH) and inherits mutmut's mode: stats_child.py, copied there as sitecustomize.py (imported at every start),
# makes a child of the stats run record its calls for the test that started it, and a child of a mutant's run run
# the mutant, `python -m` included.
STATS_CHILD = (Path(__file__).with_name("stats_child.py")).read_text()


def _generate_here(modules) -> None:
    """In the work folder: mutmut writes mutants/, then one JSON line describes every mutant."""
    import contextlib
    import io

    from mutmut.__main__ import create_mutants
    from mutmut.mutation.trampoline import set_mutant_under_test
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths

    set_mutant_under_test("mutant_generation")
    with contextlib.redirect_stdout(io.StringIO()):
        Path("mutants").mkdir(exist_ok=True)
        copy_src_dir()
        copy_also_copy_files()
        setup_source_paths()
        create_mutants(os.cpu_count() or 1)
    Path("mutants", "sitecustomize.py").write_text(STATS_CHILD)
    rows = []
    for path in modules:
        meta = json.loads((Path("mutants") / (path + ".meta")).read_text())
        names = [name for name in meta["exit_code_by_key"] if mutant_rooms.decides(path, _function_of(name))]
        if names:
            original, mutated = Path(path).read_text(), (Path("mutants") / path).read_text()
            parsed = (original.splitlines(), _defs(original), mutated.splitlines(), _defs(mutated, qualified=False))
            rows += [asdict(describe(name, path, parsed)) for name in names]
    print(json.dumps(rows))


def _function_of(name: str) -> str:
    """A mutant's function as the rooms name it: `function` or `Class.method`."""
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key

    function, cls = orig_function_and_class_names_from_key(name)
    return f"{cls}.{function}" if cls else function


def _defs(text: str, qualified: bool = True) -> dict:
    """{`function` or `Class.method` (bare names where not `qualified`): (its def line, its last line)} of each
    function and method of a file, found by Python's own parser: on a large file mutmut's mutated copy (each mutant a
    copy of its function) runs to megabytes, which libcst took minutes and gigabytes to parse."""
    spans = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef):
            inner = [(n, node.name + "." if qualified else "") for n in node.body]
        else:
            inner = [(node, "")]
        for sub, owner in inner:
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                spans.setdefault(owner + sub.name, (sub.lineno, sub.end_lineno))  # the first, as mutmut finds
    return spans


def describe(name: str, path: str, parsed: tuple) -> Mutant:
    """The mutant's function, the lines of the original file it changes and its diff (as `mutmut show` prints it).
    `parsed`: (the original file's lines, its _defs, mutmut's mutated file's lines, its _defs by bare name). The
    mutant's function in mutmut's file (named `x_function__mutmut_N`, or `xǁClassǁmethod__mutmut_N` in its class)
    differs from the original's text only where mutmut changed it: libcst writes back what it does not change."""
    qualified = _function_of(name)
    function = qualified.rpartition(".")[2]
    original, defs, mutated, mutated_defs = parsed
    if qualified not in defs:
        raise MutantsError(f"{path}: no function {qualified} for mutant {name}")
    defined = name.split(".")[-1]  # the module's name is before the function's
    span = mutated_defs.get(defined)
    if span is None:
        raise MutantsError(f"{path}: mutmut's mutated file has no function {defined} (mutant {name})")
    first = defs[qualified][0]
    old_lines = original[first - 1:defs[qualified][1]]
    new_lines = mutated[span[0] - 1:span[1]]
    new_lines[0] = new_lines[0].replace(f"def {defined}(", f"def {function}(", 1)
    lines, before, after = [], "", ""
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        lines += [first + i for i in range(i1, i2)] or [first + i1 - 1]  # a pure insertion: the line before it
        if not before and i2 > i1:
            before = old_lines[i1].strip()
        if not after and j2 > j1:
            after = new_lines[j1].strip()
    diff = "\n".join(difflib.unified_diff(_dedent(old_lines), _dedent(new_lines), fromfile=path, tofile=path,
                                          lineterm=""))
    return Mutant(name=name, path=path, function=qualified, lines=sorted(set(lines)), before=before, after=after,
                  diff=diff)


def _dedent(lines: list) -> list:
    cut = len(lines[0]) - len(lines[0].lstrip())
    return [line[cut:] if line[:cut].isspace() else line for line in lines]


# --- equivalent mutants ---------------------------------------------------------------------------------------------

def load_equivalent(path: Path = EQUIVALENT, key: str = "equivalent") -> list:
    """A reviewed list: [{"path", "function", "before", "after", "reason"}] under `key`: under "equivalent" each a
    mutant that no test can tell from the original on any device and input; under "needs_gpu" (NEEDS_GPU) each one
    only a run on a GPU can tell."""
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
        rows = data[key]
        for row in rows:
            missing = {"path", "function", "before", "after", "reason"} - set(row)
            if missing or not str(row["reason"]).strip():
                raise ValueError(f"entry {row} lacks {sorted(missing) or ['a reason']}")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise MutantsError(f"{path}: not a list of reviewed mutants ({err}); each entry is "
                           f'{{"path", "function", "before", "after", "reason"}} under "{key}"') from None
    return rows


def matches(row: dict, mutant: Mutant) -> bool:
    return (row["path"], row["function"], row["before"], row["after"]) == (mutant.path, mutant.function,
                                                                           mutant.before, mutant.after)


def split_equivalent(mutants: list, rows: list, path: Path = EQUIVALENT) -> tuple:
    """(mutants to run, equivalent mutants); an entry that matches no mutant any more is an error."""
    stale = [row for row in rows if not any(matches(row, m) for m in mutants)]
    if stale:
        listed = "\n  ".join(f"{r['path']} {r['function']}: {r['before']!r} -> {r['after']!r}" for r in stale)
        raise MutantsError(f"{path}: {len(stale)} listed equivalent mutant(s) no longer exist (the code changed):\n"
                           f"  {listed}\nremove each entry, or update it to the mutant it now means and review its "
                           "reason again")
    equivalent = [m for m in mutants if any(matches(row, m) for row in rows)]
    return [m for m in mutants if m not in equivalent], equivalent


def auto_seed(commit: str | None) -> int:
    """The sample's seed, fixed by the commit measured before anything is drawn: the first 8 hex digits of the
    SHA-256 of the commit's name (of "uncommitted" for a checkout without one)."""
    return int(hashlib.sha256((commit or "uncommitted").encode()).hexdigest()[:8], 16)


def training_seeds(path: Path = TRAINING_SEEDS) -> dict:
    """{seed: why}: the samples whose survivors tests were written against (never a headline again)."""
    if not path.exists():
        return {}
    try:
        return {int(row["seed"]): str(row["why"]) for row in json.loads(path.read_text())["training"]}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise MutantsError(f"{path}: not a list of training seeds ({err}); each entry is {{\"seed\": N, \"why\": "
                           f"...}} under \"training\"") from None


# --- choose ---------------------------------------------------------------------------------------------------------

def sample(mutants: list, n: int, seed: int) -> list:
    ordered = sorted(mutants, key=lambda m: m.name)
    return ordered if n >= len(ordered) else sorted(random.Random(seed).sample(ordered, n), key=lambda m: m.name)


def resolve_base(ref: str, source: Path = ROOT) -> str:
    """The commit a change is measured from. `auto`: the merge base of HEAD with main (origin/main if there is no
    local main); on main itself, HEAD's first parent: the last change."""

    def git(*args):
        done = subprocess.run(["git", *args], cwd=source, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    if ref != "auto":
        commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
        if not commit:
            raise MutantsError(f"--changed-since {ref}: not a commit here; give a branch, tag or commit (or auto)")
        return commit
    head = git("rev-parse", "HEAD")
    for main in ("main", "origin/main"):
        base = git("merge-base", "HEAD", main)
        if base:
            break
    else:
        raise MutantsError("--changed-since auto: no main or origin/main to diff against; fetch main, or name the "
                           "base commit with --changed-since REF")
    if base == head:
        base = git("rev-parse", "--verify", "HEAD^")
        if not base and git("rev-parse", "--is-shallow-repository") == "true":
            git("fetch", "-q", "--deepen=1")  # a shallow clone: fetch the parent, then look again
            base = git("rev-parse", "--verify", "HEAD^")
        if not base:
            raise MutantsError("--changed-since auto: HEAD is main and has no parent here (a shallow clone?); fetch "
                               "at least two commits (git fetch --deepen=1) or name the base with --changed-since")
    return base


def changed_lines(base: str, source: Path = ROOT, modules=MODULES) -> dict:
    """{path: set of line numbers} of MODULES' lines added or changed since `base` (working tree included)."""
    done = subprocess.run(["git", "diff", "-U0", "--no-color", base, "--", *modules], cwd=source, check=True,
                          capture_output=True, text=True)
    out, path = {}, None
    for line in done.stdout.splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else None
        elif line.startswith("@@") and path:
            new = line.split()[2]  # +start[,count]
            start, _, count = new[1:].partition(",")
            count = int(count) if count else 1
            out.setdefault(path, set()).update(range(int(start), int(start) + count))
    return out


def touching(mutants: list, lines: dict) -> list:
    return [m for m in mutants if set(m.lines) & lines.get(m.path, set())]


# --- run ------------------------------------------------------------------------------------------------------------

def run_and_confirm(work: Path, mutants: list, children: int, budget: float | None, progress: Progress,
                    tests=TESTS) -> dict:
    """run_mutants, then each mutant that timed out once more, alone (one worker) with CONFIRM x the time: only a
    timeout seen again counts (as killed). One that passes alone is a survivor; one whose second run did not finish
    within the budget is not judged (ran["unconfirmed"])."""
    ran = run_mutants(work, mutants, children, budget, progress, tests)
    ran["unconfirmed"] = []
    timed_out = [m for m in mutants if m.name in ran["completed"] and STATUS.get(ran["codes"][m.name][0]) == TIMEOUT]
    if not timed_out:
        return ran
    left, rerun = None if budget is None else budget - ran["seconds"], set()
    if left is None or left > 0:
        progress.say(f"{len(timed_out)} timeout(s) to confirm: each again alone, with {CONFIRM} x the time")
        again = run_mutants(work, timed_out, 1, left, progress, tests, multiplier=MULTIPLIER * CONFIRM, stats=False)
        ran["codes"].update({name: again["codes"][name] for name in again["completed"]})
        ran["seconds"] += again["seconds"]
        ran["out_of_time"], rerun = again["out_of_time"], again["completed"]
    for m in timed_out:
        if m.name not in rerun:
            ran["codes"][m.name] = (None, ran["codes"][m.name][1])
            ran["unconfirmed"].append(m.name)
    return ran


def run_mutants(work: Path, mutants: list, children: int, budget: float | None, progress: Progress,
                tests=TESTS, multiplier: int = MULTIPLIER, stats: bool = True) -> dict:
    """`mutmut run` on the named mutants: {"codes": {name: (exit code or None, seconds)}, "tests": mutmut's tests
    per function, "completed": the names this run finished, "out_of_time", "seconds"}."""
    log = work / "mutants" / "mutmut-debug.log"
    if log.exists():
        log.unlink()
    config = work / "setup.cfg"
    config.write_text(re.sub(r"(?m)^timeout_multiplier = .*$", f"timeout_multiplier = {multiplier}",
                             config.read_text()))
    from harness.model.checkpoint import cache_dir

    failures = work / "failures.txt"  # harness.audit.failures: each test that fails, in any of mutmut's runs
    failures.unlink(missing_ok=True)
    # children started by tests import the mutated fastpath too; built checkpoints are shared with the checkout's
    env = dict(os.environ, PYTHONPATH=str(work / "mutants"), FASTPATH_CACHE=str(cache_dir()), **THREADS)
    env[FAILURES_ENV] = str(failures)
    output = (work / "mutmut-output.txt").open("w")
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(children)] + [m.name for m in mutants]
    progress.say((f"mutmut: stats run of the tests ({', '.join(tests)}), a clean run, then " if stats else
                  "mutmut: a clean run of their tests, then ") + f"{len(mutants)} mutant(s) on {children} worker(s)")
    proc = subprocess.Popen(command, cwd=work, env=env, stdout=output, stderr=subprocess.STDOUT,
                            start_new_session=True)
    started, seen, counts, first = time.monotonic(), {}, {}, None
    out_of_time = False
    while True:
        finished = proc.poll() is not None
        if log.exists():
            for name, code, seconds in COMPLETED.findall(log.read_text(errors="replace")):
                if name not in seen:
                    first = first or time.monotonic()
                    seen[name] = (int(code), float(seconds))
                    status = STATUS.get(int(code), OTHER)
                    counts[status] = counts.get(status, 0) + 1
                    spent = time.monotonic() - first
                    left = spent / len(seen) * (len(mutants) - len(seen))
                    progress.say(f"{len(seen)}/{len(mutants)} done: " + ", ".join(
                        f"{counts.get(s, 0)} {s}" for s in (KILLED, SURVIVED, TIMEOUT, NO_TESTS)) +
                        f"; {clock(time.monotonic() - started)} elapsed, about {clock(left)} left")
        if finished:
            break
        if budget is not None and time.monotonic() - started > budget:
            out_of_time = True
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            break
        time.sleep(2)
    output.close()
    text = (work / "mutmut-output.txt").read_text(errors="replace")
    if proc.returncode not in (0, None) and not out_of_time and not seen:
        failed = list(dict.fromkeys(failures.read_text(errors="replace").splitlines())) if failures.exists() else []
        named = (f"{len(failed)} test(s) failed on the unmutated code:\n  " + "\n  ".join(failed)
                 + "\n") if failed else "no test was reported failing (a crash, or pytest's own error); "
        raise MutantsError(f"mutmut stopped before running a mutant (exit {proc.returncode}); {named}its output ends:\n"
                           f"{_tail(text)}\nthe tests must pass on the unmutated code first (pytest {' '.join(tests)})")
    codes = {}
    for path in {m.path for m in mutants}:
        meta = work / "mutants" / (path + ".meta")
        if meta.exists():
            data = json.loads(meta.read_text())
            for name, code in data["exit_code_by_key"].items():
                # mutmut's meta may hold 0.0 for a mutant's duration: its log's "Completed" line has the real one
                seconds = data.get("durations_by_key", {}).get(name) or seen.get(name, (None, None))[1]
                codes[name] = (code, seconds)
    stats_file = work / "mutants" / "mutmut-stats.json"
    tests = json.loads(stats_file.read_text()).get("tests_by_mangled_function_name", {}) if stats_file.exists() else {}
    return {"codes": codes, "tests": tests, "completed": set(seen), "out_of_time": out_of_time,
            "seconds": time.monotonic() - started,
            "setup_seconds": None if first is None else first - started}  # the stats and clean runs, before any mutant


def _tail(text: str, lines: int = 40) -> str:
    text = re.sub(r"[^\n]*\r", "", text)  # spinner frames drawn over each other
    text = re.sub(r"(?m)^[\u2800-\u28ff] [^\n]*\n", "", text)  # and those written a line each
    return "\n".join(text.splitlines()[-lines:])


# --- judge ----------------------------------------------------------------------------------------------------------

def interval(killed: int, n: int) -> tuple:
    """Exact (Clopper-Pearson) 95% interval of a proportion."""
    from scipy.stats import binomtest

    if n == 0:
        return (0.0, 1.0)
    ci = binomtest(killed, n).proportion_ci(0.95, method="exact")
    return (float(ci.low), float(ci.high))


def judge(mutants: list, ran: dict) -> dict:
    """Each mutant's status from its run; the tally of them all, and of each room ("rooms")."""
    for m in mutants:
        code, seconds = ran["codes"].get(m.name, (None, None))
        m.status = STATUS.get(code, OTHER) if code is not None else OTHER
        if (m.path, m.function) in IMPORT_TIME:
            m.status = OTHER  # runs at import: its tests are not known (IMPORT_TIME), killed or not
        m.seconds = seconds
        m.tests = sorted(ran["tests"].get(m.name.partition("__mutmut_")[0], []))
    summary = tally(mutants)
    summary["rooms"] = {room: tally([m for m in mutants if m.room == room])
                        for room in dict.fromkeys(m.room for m in mutants if m.room)}
    return summary


def tally(mutants: list) -> dict:
    """killed (a timeout seen twice counts), survived (and "no tests"), not judged; the score and its interval."""
    killed = sum(m.status in (KILLED, TIMEOUT) for m in mutants)
    survived = [m for m in mutants if m.status in (SURVIVED, NO_TESTS)]
    n = killed + len(survived)
    low, high = interval(killed, n)
    return {"killed": killed, "survived": len(survived), "timeouts": sum(m.status == TIMEOUT for m in mutants),
            "not_judged": sum(m.status == OTHER for m in mutants), "judged": n,
            "score": killed / n if n else None, "interval": [low, high]}


def rerun_command(m: Mutant) -> str:
    return (f"fastpath-suite audit mutants --names {m.name}   # or, in {work_folder() / 'work'}: "
            f"python -m mutmut run {m.name}; python -m mutmut show {m.name}")


# --- results --------------------------------------------------------------------------------------------------------

def render_results(figures: dict) -> str:
    s = figures["summary"]
    score = "n/a" if s["score"] is None else f"{100 * s['score']:.1f}%"
    tests, sets = figures["tests"], [t for t in figures.get("timings", []) if t.get("rooms")]
    gpu = figures.get("needs_gpu", [])
    flat = ("each room's own (below)" if sets else "; ".join(", ".join(t) for t in tests)
            if tests and isinstance(tests[0], list) else ", ".join(tests))
    out = [f"Engine {figures['engine']}; {figures['selection']}; tests: {flat}; "
           f"{figures['children']} worker(s) of {figures.get('threads', 1)} torch thread each; "
           f"{clock(figures['seconds'])} in all.", ""]
    if sets:  # one run of mutmut per set of tests: the rooms it served, what it ran and for how long
        out += ["| rooms | mutants | time | the tests their mutants meet |", "|---|---:|---:|---|"]
        out += [f"| {', '.join(t['rooms'])} | {t['mutants']} | {clock(t['seconds'])} | "
                + ", ".join(f"`{a}`" for a in t["tests"]) + " |" for t in sets]
        out += [""]
    if "seed" in figures:
        out += [f"Sample: seed {figures['seed']} ({figures['seed_from']}); {figures['sample_role']} sample"
                + (" (no test was written against its survivors before it ran)."
                   if figures["sample_role"] == "fresh" else "."), ""]
    out += ["| mutants run | killed (timeouts) | survived | not judged | equivalent, left out | need a GPU, apart | "
            "score | exact 95% interval |",
            "|---:|---:|---:|---:|---:|---:|---:|---|",
            f"| {figures['run']} | {s['killed']} ({s['timeouts']}) | {s['survived']} | {s['not_judged']} | "
            f"{figures['equivalent']} | {len(gpu) if 'needs_gpu' in figures else 'not counted'} | {score} | "
            f"{100 * s['interval'][0]:.1f}% to {100 * s['interval'][1]:.1f}% |", ""]
    for b in figures.get("broken", []):
        out += [f"Not judged: the {b['mutants']} mutant(s) of `pytest {' '.join(b['tests'][:3])} ...`: their tests "
                f"did not pass on the unmutated code ({b['error'].strip().splitlines()[-1][:200]}).", ""]
    if s["not_judged"]:
        out += [f"{s['not_judged']} of the {figures['run']} mutants did not finish or could not be judged (a run stopped "
                "early, or a function that runs at import); the score and its interval are of the judged ones.", ""]
    if s.get("rooms"):
        out += ["| room | killed of judged | score | exact 95% interval | not judged |", "|---|---:|---:|---|---:|"]
        for room, r in s["rooms"].items():
            out += [f"| {room} | {r['killed']} of {r['judged']} | "
                    + ("n/a | n/a" if r["score"] is None else
                       f"{100 * r['score']:.1f}% | {100 * r['interval'][0]:.1f}% to {100 * r['interval'][1]:.1f}%")
                    + f" | {r['not_judged']} |"]
        out += [""]
    by_module = {}
    for row in figures["mutants"]:
        k, n = by_module.get(row["path"], (0, 0))
        judged = row["status"] in (KILLED, TIMEOUT, SURVIVED, NO_TESTS)
        by_module[row["path"]] = (k + (row["status"] in (KILLED, TIMEOUT)), n + judged)
    out += ["| module | killed of judged |", "|---|---:|"]
    out += [f"| `{path}` | {k} of {n} |" for path, (k, n) in sorted(by_module.items())]
    survivors = [row for row in figures["mutants"] if row["status"] in (SURVIVED, NO_TESTS)]
    if survivors:
        out += ["", "Survivors:", ""]
        for row in survivors:
            out += [f"- `{row['name']}` ({row['status']}; `{row['path']}` line {row['lines'][0] if row['lines'] else '?'}): "
                    f"`{row['before']}` -> `{row['after'] or '(removed)'}`"]
    if gpu:
        out += ["", "Only a GPU run can observe (counted apart; `gpu-check` runs them on a device):", ""]
        out += [f"- `{row['path']}` `{row['function']}`: `{row['before']}` -> `{row['after'] or '(removed)'}`"
                for row in gpu]
    return "\n".join(out) + "\n"


# --- command --------------------------------------------------------------------------------------------------------

def seed_arg(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, or auto (derived from the commit "
                                         "measured)") from None


def main(argv=None) -> int:
    from harness.run import results
    from harness.run.cli import int_at_least

    parser = argparse.ArgumentParser(prog="fastpath-suite audit mutants", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--sample", type=int_at_least(1), default=300, help="how many mutants to draw")
    which.add_argument("--changed-since", metavar="REF",
                       help="only the mutants of lines changed since REF (auto: the merge base with main)")
    which.add_argument("--names", nargs="+", metavar="NAME", help="these mutants (mutmut's names)")
    which.add_argument("--needs-gpu", action="store_true",
                       help=f"the mutants only a GPU run can observe ({NEEDS_GPU.relative_to(ROOT)}), against the "
                            "cuda tests (gpu-check runs this on a device)")
    parser.add_argument("--seed", type=seed_arg, default="auto",
                        help="seed of the sample; auto: derived from the commit measured, and recorded")
    parser.add_argument("--training", choices=("before", "after"),
                        help="the sample's seed is a training seed: this run is its score before or after the tests "
                             "written against its survivors (results kinds mutants-before, mutants-after)")
    parser.add_argument("--max-mutants", type=int_at_least(1), default=None,
                        help="with --changed-since: run at most this many; the rest are named as not judged "
                             "(exit 3)")
    parser.add_argument("--children", type=int_at_least(1), default=2, help="mutants run at once")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="stop after this long; mutants left unrun make the run 'not judged' (exit 3)")
    parser.add_argument("--rooms", nargs="+", default=None, metavar="ROOM",
                        choices=[room.name for room in mutant_rooms.ROOMS],
                        help="the rooms to mutate (default all: " +
                             ", ".join(room.name for room in mutant_rooms.ROOMS) + ")")
    parser.add_argument("--modules", nargs="+", default=None, choices=MODULES, metavar="PATH",
                        help="only these files of the rooms")
    parser.add_argument("--tests", nargs="+", default=None,
                        help="the tests every mutant meets (default: each room's own)")
    parser.add_argument("--min-score", type=float, default=None,
                        help="pass with survivors when the score reaches this (0-1); default: any survivor fails")
    parser.add_argument("--equivalent", type=Path, default=EQUIVALENT, help="the reviewed equivalent mutants")
    parser.add_argument("--gpu-list", type=Path, default=NEEDS_GPU, help="the mutants only a GPU run can observe")
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout to mutate")
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: <cache>/mutants/work)")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    progress = Progress("mutants", quiet=args.quiet)
    try:
        return _main(args, progress)
    except MutantsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def kind_of(args, seed) -> str:
    """The results kind a run is filed under: a sample's headline (mutants) only on a seed never trained on."""
    if args.changed_since or args.names or args.needs_gpu:
        if args.training:
            raise MutantsError("--training is for a sample (--sample N --seed S)")
        return "mutants-change" if args.changed_since or args.names else "mutants-gpu"
    trained = training_seeds()
    if args.training and seed not in trained:
        raise MutantsError(f"--training {args.training}: seed {seed} is not listed in "
                           f"{TRAINING_SEEDS.relative_to(ROOT)}; list it (with why) once tests are written against "
                           "its survivors, or leave --training out for a fresh sample")
    if not args.training and seed in trained:
        raise MutantsError(f"seed {seed} is a training seed ({trained[seed]}): its score is not a headline. Give "
                           "--training before or --training after, or draw a fresh sample (--seed auto)")
    return f"mutants-{args.training}" if args.training else "mutants"


def _main(args, progress: Progress) -> int:
    from harness.run import results

    source = args.source.resolve()
    work = args.work or (work_folder() / "work")
    chosen_rooms = mutant_rooms.rooms(args.rooms)
    modules = [m for m in mutant_rooms.files(chosen_rooms) if not args.modules or m in args.modules]
    if args.changed_since:
        base = resolve_base(args.changed_since, source)
        lines = changed_lines(base, source, modules)
        if not lines:
            print(f"mutants: no line of the mutated files ({len(modules)} in {len(chosen_rooms)} room(s)) changed "
                  f"since {base[:12]}: nothing to mutate")
            return 0
        modules = [m for m in modules if m in lines]
    # what the work copy holds is the checkout now: a run takes long, and the checkout may change before it ends
    commit, dirty = results.checkout_state(source)
    seed = auto_seed(commit) if args.seed == "auto" else args.seed
    kind = kind_of(args, seed) if getattr(args, "results", None) is not None else None  # checked before the run
    groups = {}  # tests -> files: rooms that meet the same tests share one work folder and one stats run
    for path in modules:
        tests = tuple(args.tests) if args.tests else mutant_rooms.selection(mutant_rooms.room_of(path))
        groups.setdefault(tests, []).append(path)
    whole = {}  # with --changed-since: the narrow tests of each group -> the room's whole selection
    if args.changed_since and not args.tests:
        # a change's mutants meet first the tests that import its files (the stats run of a room's whole selection
        # is most of the stage's time); a survivor is then run again on the whole selection (widen)
        narrow = {}
        for tests, paths in groups.items():
            own = mutant_rooms.own_tests(mutant_rooms.room_of(paths[0]), paths, source)
            narrow[own], whole[own] = paths, tests
        groups = narrow
    mark = "cuda" if args.needs_gpu else None
    everything, folders, generating = [], {}, {}
    for i, (tests, paths) in enumerate(groups.items()):
        folder = work if len(groups) == 1 else work / f"tests-{i + 1}"
        progress.say(f"preparing {folder} and generating the mutants of {len(paths)} file(s)")
        started = time.monotonic()
        prepare(folder, tests, source, paths, mark)
        found = generate(folder, paths)
        generating[tests] = time.monotonic() - started
        for m in found:
            if mutant_rooms.decides(m.path, m.function):
                m.room = mutant_rooms.room_of(m.path).name
                everything.append(m)
                folders[m.name] = (folder, tests)
    rows = [row for row in load_equivalent(args.equivalent) if row["path"] in modules]
    gpu_rows = [row for row in load_equivalent(args.gpu_list, "needs_gpu") if row["path"] in modules]
    candidates, equivalent = split_equivalent(everything, rows, args.equivalent)
    candidates, needs_gpu = split_equivalent(candidates, gpu_rows, args.gpu_list)
    left_out = {m.name for m in equivalent + needs_gpu}
    capped = []
    if args.needs_gpu:
        chosen, selection = needs_gpu, f"the {len(needs_gpu)} mutant(s) only a GPU run can observe"
        if not chosen:
            print(f"mutants: {selection}: nothing to run")
            return 0
    elif args.names:
        known = {m.name: m for m in everything}
        unknown = [n for n in args.names if n not in known]
        if unknown:
            raise MutantsError(f"no such mutant(s): {unknown}; names are mutmut's, as the survivors list prints them")
        chosen = [known[n] for n in args.names if n not in left_out]  # reviewed: left out, as in a sample
        selection = (f"{len(args.names)} named mutant(s)" + (f", {len(args.names) - len(chosen)} of them reviewed as "
                                                               f"equivalent or needing a GPU"
                                                               if len(chosen) < len(args.names) else ""))
        if not chosen:
            print(f"mutants: {selection}: nothing to run")
            return 0
    elif args.changed_since:
        touched = touching(candidates, lines)
        selection = (f"the {len(touched)} mutant(s) of the {sum(map(len, lines.values()))} line(s) changed since "
                     f"{base[:12]}")
        chosen = touched
        if args.max_mutants and len(touched) > args.max_mutants:
            chosen = sample(touched, args.max_mutants, seed)
            capped = [m for m in touched if m not in chosen]
            selection += f", {args.max_mutants} of them run (a sample, seed {seed}): {len(capped)} past the cap"
        if not chosen:
            print(f"mutants: the changed lines hold no mutant ({selection}); nothing to run")
            return 0
    else:
        # drawn from every mutant, then the reviewed ones left out: a seed draws the same mutants however the
        # lists grow, so runs before and after a review compare
        drawn = sample(everything, args.sample, seed)
        chosen = [m for m in drawn if m.name not in left_out]
        selection = (f"a sample of {len(drawn)} of {len(everything)} mutants (seed {seed}"
                     + (", derived from the commit" if args.seed == "auto" else "") + f"), "
                     f"{sum(m.name in {e.name for e in equivalent} for m in drawn)} of them reviewed as equivalent, "
                     f"{sum(m.name in {g.name for g in needs_gpu} for m in drawn)} needing a GPU")
    progress.say(f"{len(everything)} mutants generated, {len(equivalent)} listed as equivalent, {len(needs_gpu)} "
                 f"as needing a GPU; running {selection}")
    ran = {"codes": {}, "tests": {}, "completed": set(), "out_of_time": False, "seconds": 0.0, "unconfirmed": []}
    timings = []  # per set of tests: its mutants, its seconds, and how many of them went to the stats and clean runs
    broken = []  # sets of tests whose stats or clean run failed
    for tests in groups:
        part = [m for m in chosen if folders[m.name][1] == tests]
        left = None if args.budget is None else args.budget - ran["seconds"]
        if not part or (left is not None and left <= 0):
            continue
        try:
            got = run_and_confirm(folders[part[0].name][0], part, args.children, left, progress, tests)
        except MutantsError as err:  # this set of tests could not run: its mutants are not judged, the others run
            progress.say(f"error: {err}")
            broken.append({"tests": list(tests), "mutants": len(part), "names": [m.name for m in part],
                           "error": str(err)[-3000:]})
            continue
        ran["codes"].update(got["codes"])
        ran["completed"] |= got["completed"]
        absorb(ran, got, part, tests, timings, generating[tests])
    widened = widen(chosen, ran, whole, folders, work, args, progress, timings) if whole else []
    summary = judge(chosen, ran)
    trained = training_seeds()
    figures = {"engine": ENGINE, "selection": selection, "tests": [list(t) for t in groups],
               "rooms": [room.name for room in chosen_rooms], "children": args.children,
               "threads": int(THREADS["OMP_NUM_THREADS"]), "seconds": ran["seconds"], "generated": len(everything),
               "equivalent": len(equivalent), "needs_gpu": [asdict(m) for m in needs_gpu],
               "seed": seed, "seed_from": f"commit {commit}" if args.seed == "auto" else "given",
               "sample_role": (f"training, {args.training} its tests" if args.training else
                               "training" if seed in trained else "fresh"),
               "run": len(chosen), "summary": summary, "unconfirmed": ran["unconfirmed"],
               "capped": [m.name for m in capped], "capped_rooms": _by_room(capped), "widened": widened,
               "timings": timings, "broken": broken,
               "mutants": [asdict(m) for m in chosen]}
    if kind:
        results.write_if_asked(args, kind, figures, commit=commit, dirty=dirty)
    print(report(figures, chosen))
    unrun = [m for m in chosen if m.status == OTHER and (m.path, m.function) not in IMPORT_TIME]
    if broken:
        for b in broken:
            print(f"NOT JUDGED: the {b['mutants']} mutant(s) of pytest {' '.join(b['tests'])}: {b['error']}")
        return 2
    survivors = [m for m in chosen if m.status in (SURVIVED, NO_TESTS)]
    if survivors and (args.min_score is None or (summary["score"] or 0) < args.min_score):
        return 1
    if unrun or capped:
        if unrun:
            print(f"NOT JUDGED: {len(unrun)} mutant(s) did not finish"
                  + (f" within --budget {args.budget:g} s" if ran["out_of_time"] else "")
                  + "; give more time (--budget) or fewer mutants (--max-mutants)")
        if capped:
            print(f"NOT JUDGED: {len(capped)} mutant(s) of the changed lines past --max-mutants {args.max_mutants}: "
                  + ", ".join(m.name for m in capped) + "; run them (--names, or a larger --max-mutants), or split "
                  "the change")
        return strict.NOT_JUDGED
    return 0


def absorb(ran: dict, got: dict, part: list, tests: tuple, timings: list, generated: float, **row) -> None:
    """One run of `part` on `tests` (run_and_confirm's `got`) added to the whole run's `ran`: its seconds, the tests
    each function met, the names not confirmed, whether the budget ran out, and its row of `timings`. Its codes are
    the caller's to take: all of them in the main loop, the widened mutants' alone in `widen`."""
    ran["tests"].update(got["tests"])
    ran["unconfirmed"] += got["unconfirmed"]
    ran["seconds"] += got["seconds"]
    ran["out_of_time"] |= got["out_of_time"]
    timings.append({"tests": list(tests), "rooms": sorted({m.room for m in part}), "mutants": len(part),
                    "generate_seconds": generated, "seconds": got["seconds"], "setup_seconds": got.get("setup_seconds"),
                    **row})


def widen(chosen: list, ran: dict, whole: dict, folders: dict, work: Path, args, progress: Progress,
          timings: list) -> list:
    """Each survivor of a narrow run (the tests that import the changed files) run again on its room's whole
    selection, within what is left of the budget: what it gives is the mutant's verdict, and one that does not
    finish there is not judged (never a survivor of a narrow run alone). The names run again."""
    # mutmut gives "no tests" without running the mutant (no line in its log): its code is in the meta alone
    found = [m for m in chosen if STATUS.get(ran["codes"].get(m.name, (None,))[0]) in (SURVIVED, NO_TESTS)
             and (m.path, m.function) not in IMPORT_TIME]
    by_tests = {}
    for m in found:
        if folders[m.name][1] != whole[folders[m.name][1]]:
            by_tests.setdefault(whole[folders[m.name][1]], []).append(m)
    for i, (tests, part) in enumerate(by_tests.items()):
        left = None if args.budget is None else args.budget - ran["seconds"]
        got = {"completed": set()}
        if left is None or left > 0:
            folder = work / f"whole-{i + 1}"
            progress.say(f"{len(part)} survivor(s) of the changed files' own tests: again on the room's whole "
                         f"selection ({' '.join(tests)})")
            started = time.monotonic()
            paths = sorted({m.path for m in part})
            prepare(folder, tests, args.source.resolve(), paths)
            generate(folder, paths)
            generated = time.monotonic() - started
            got = run_and_confirm(folder, part, args.children, None if left is None else left - generated,
                                  progress, tests)
            ran["seconds"] += generated
            absorb(ran, got, part, tests, timings, generated, widened=True)
        for m in part:  # mutmut's meta holds no code for a mutant it did not run ("no tests" it gives unrun)
            ran["codes"][m.name] = got.get("codes", {}).get(m.name) or (None, None)
    return [m.name for part in by_tests.values() for m in part]


def _by_room(found: list) -> dict:
    rooms = {}
    for m in found:
        rooms[m.room] = rooms.get(m.room, 0) + 1
    return rooms


def report(figures: dict, chosen: list) -> str:
    s = figures["summary"]
    lines = [f"mutants: {figures['selection']}; engine {figures['engine']}; {clock(figures['seconds'])}"]
    if s["score"] is not None:
        lines.append(f"score: {s['killed']} killed of {s['judged']} = {100 * s['score']:.1f}% (exact 95% interval "
                     f"{100 * s['interval'][0]:.1f}% to {100 * s['interval'][1]:.1f}%); {s['timeouts']} of the killed "
                     f"timed out; {s['not_judged']} not judged; {figures['equivalent']} listed as equivalent; "
                     f"{len(figures.get('needs_gpu', []))} need a GPU (counted apart: gpu-check runs them)")
        lines.append(f"sample: seed {figures.get('seed')} ({figures.get('seed_from')}), "
                     f"{figures.get('sample_role', 'fresh')}")
        for room, r in s.get("rooms", {}).items():
            lines.append(f"  {room}: " + (f"{r['killed']} killed of {r['judged']} = {100 * r['score']:.1f}% "
                                          f"({100 * r['interval'][0]:.1f}% to {100 * r['interval'][1]:.1f}%)"
                                          if r["score"] is not None else "none judged")
                         + (f", {r['not_judged']} not judged" if r["not_judged"] else ""))
    for m in chosen:
        if m.status == OTHER:
            why = ("runs at import, so mutmut cannot tell which tests meet it" if (m.path, m.function) in IMPORT_TIME
                   else "timed out beside another mutant; its run alone did not finish in time"
                   if m.name in figures.get("unconfirmed", []) else "its tests failed on the unmutated code"
                   if any(m.name in b["names"] for b in figures.get("broken", [])) else
                   "survived the tests that import its file; the room's whole selection did not finish within the "
                   "budget" if m.name in figures.get("widened", []) else "did not finish within the budget")
            lines.append(f"not judged: {m.name} ({m.path} line {m.lines[0] if m.lines else '?'}): {why}")
    for m in chosen:
        if m.status == TIMEOUT:
            lines.append(f"timeout: {m.name} ({m.path} line {m.lines[0] if m.lines else '?'}), again when run alone "
                         f"with {CONFIRM} x the time")
    for m in chosen:
        if m.status in (SURVIVED, NO_TESTS):
            ran = ("no test calls this function" if m.status == NO_TESTS else
                   f"{len(m.tests)} test(s) ran: " + ", ".join(m.tests[:8]) + (" ..." if len(m.tests) > 8 else ""))
            lines += [f"SURVIVED: {m.name} ({m.path} line {m.lines[0] if m.lines else '?'}); {ran}", m.diff,
                      f"  run it again: {rerun_command(m)}",
                      f"  equivalent? add it to {EQUIVALENT.relative_to(ROOT)} with the reason", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
