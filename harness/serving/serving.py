"""omnivoice-server from the package index, with fastpath applied after the server's own load: the serving check.

    fastpath-suite serve-check                     # make the environment (once), run the check, print the timings
    fastpath-suite serve-check --results results/  # also write the results file (docs/results.md renders it)

The environment (`prepare`), made as a user's would be: a fresh venv under .cache/serving/ into which pip installs
this checkout's wheel (`pip wheel --no-deps .`) together with `SERVER` from the package index, so that pip itself
picks an omnivoice release both admit (omnivoice-server 0.2.5 requires omnivoice < 0.2.0, fastpath's declared range
then gives 0.1.5). First the same install is resolved with `--dry-run` while the venv is still empty, torch
included (constraints-cpu.txt): that resolution is what a user's `pip install` does. The real install does not copy
torch again: torch, torchaudio and everything they require are linked from this environment into a folder beside
the venv, put on the venv's path by a .pth file and pinned to their versions, so pip resolves and installs the rest
against them and never changes them.

The check (`check`) starts the server on 127.0.0.1 (a free port) twice with the built tiny checkpoint: stock (the
server's own entry point, `python -m omnivoice_server`) and with fastpath (the recipe of docs/serving.md, "fastpath
in omnivoice-server", run as a user runs it: the server's own load, then `fastpath.apply` on the loaded model).
Both run with 2 inference workers (`--max-concurrent 2`), `--num-step 8` and the deterministic default
`--position-temperature 0`; requests that want sampling noise ask for it with a seed. Each server gets the same
requests of every kind it serves (`plan`), first one at a time, then all at once from `CLIENTS` threads, and is
then stopped with a signal (SIGTERM for stock, SIGINT for fastpath). A recorder runs inside each server
(harness/serving/serving_probe.py): per generation, the tokens it decoded and when it ran on which worker. The check
passes when every response is 200 and byte for byte the stock server's, every generation's tokens are stock's,
the patched server's model had the lossless stack applied, generations of the concurrent round overlapped in
time on the two workers, neither log holds an error or a traceback, and both servers ended their own shutdown
and exited on the signal. Bounded: a fixed number of requests, each with a timeout, the start and the stop too.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from harness import DISTRIBUTION, REPO_ROOT
from harness.run import results as result_files
from harness.model.checkpoint import build_checkpoint, cache_dir
from harness.run.machine import tree_digest
from harness.run.progress import Progress

SERVER = "omnivoice-server==0.2.5"
CONSTRAINTS = REPO_ROOT / "constraints-cpu.txt"
SHARED_ROOTS = ("torch", "torchaudio")  # linked from this environment with everything they require
PROBE = Path(__file__).with_name("serving_probe.py")
DOC = REPO_ROOT / "docs" / "serving.md"
RECIPE_HEADING = "## fastpath in omnivoice-server"
REFERENCE = REPO_ROOT / "fixtures" / "reference" / "ref_3s"  # .wav and .txt: the clone uploads' reference
NUM_STEP = 8
WORKERS = 2  # the server's inference threads (--max-concurrent)
CLIENTS = 4  # client threads of the concurrent round
START_TIMEOUT = 900  # s: imports and the load on a busy 2-core machine; a hang guard
REQUEST_TIMEOUT = 600  # s, each request: a hang guard
STOP_TIMEOUT = 120  # s from the signal to the exit
PIP_TIMEOUT = 3600
SIGNALS = {"stock": signal.SIGTERM, "fastpath": signal.SIGINT}
# uvicorn, once its shutdown is done, raises the signal it caught again: SIGTERM then ends the process by its default
# action (the exit status tells a supervisor so), SIGINT's KeyboardInterrupt is caught by uvicorn.run (exit 0)
EXIT_STATUS = {signal.SIGTERM: -signal.SIGTERM, signal.SIGINT: 0}
# Requests stock itself fails, with the message it fails with: fastpath must fail them alike (same status, same
# body). omnivoice 0.1.5's generate returns numpy arrays; omnivoice-server 0.2.5's script route calls .numel().
STOCK_FAILS = {"script, two speakers": "'numpy.ndarray' object has no attribute 'numel'"}
STREAM_CHUNK_MAX_CHARS = 40  # the server's sentence split for streams (OMNIVOICE_STREAM_CHUNK_MAX_CHARS): one each
STREAM_SENTENCES = ("The gates open at noon.", "Tea is served at four.", "The last bus is late.")
CLONE_STREAM_SENTENCES = ("Engineers measured the old bridge.", "They wrote a long report.")
LONG_TEXT = ("The library opens at nine in the morning. Visitors may borrow up to six books at a time. Please return "
             "them within three weeks.")
LOG_PROBLEMS = re.compile(r"Traceback|\[ERROR|\bERROR:|\[CRITICAL|Exception in ")


class ServingError(RuntimeError):
    """The serving environment cannot be made or a server cannot be started; the message names the fix."""


# --- the environment ----------------------------------------------------------------------------------------


@dataclass
class ServeEnv:
    folder: Path
    python: Path
    resolved: dict  # {name: version} of the --dry-run resolution in the empty venv
    installed: dict  # {name: version} in the venv, and where fastpath and omnivoice import from
    seconds: float  # time it took to make (0 when reused)


def environment_key() -> str:
    """What the environment is made of: fastpath's sources and metadata, the server, the pins, torch's version."""
    h = hashlib.sha256()
    for part in (tree_digest(REPO_ROOT / "fastpath", (".py", ".json")), (REPO_ROOT / "pyproject.toml").read_text(),
                 SERVER, CONSTRAINTS.read_text(), metadata.version("torch"), sys.version):
        h.update(part.encode())
    return h.hexdigest()[:12]


def _run(cmd, what: str, timeout: float = PIP_TIMEOUT, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)
    if done.returncode != 0:
        raise ServingError(f"{what} failed (exit {done.returncode}): `{' '.join(map(str, cmd))}`\n"
                           f"{done.stderr[-4000:]}\nFix: check that the package index is reachable and that "
                           f"{SERVER} and fastpath's declared omnivoice range have a release in common")
    return done


def build_wheel(dest: Path) -> Path:
    """fastpath's wheel from a copy of the checkout (building in the checkout would leave build/ there)."""
    source = dest / "src"
    shutil.copytree(REPO_ROOT, source, ignore=lambda d, names: [n for n in names if n in (
        ".git", ".venv", ".cache", "out", "build", "__pycache__") or n.endswith(".egg-info")])
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", dest, source],
         "pip wheel of fastpath")
    shutil.rmtree(source)
    (wheel,) = dest.glob(f"{DISTRIBUTION.replace('-', '_')}-*.whl")  # the wheel's file name: the name with "_"
    return wheel


def _pip(python: Path, *args) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check", *args],
                f"pip {args[0]} into {python}")


def _report_versions(path: Path) -> dict:
    report = json.loads(path.read_text())
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}


def requirement_closure(roots) -> dict:
    """{name: Distribution} of the roots and everything they require in this environment (extras followed)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, todo, seen = {}, [(r, frozenset()) for r in roots], set()
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), extras)
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a marker-less requirement this environment lacks: pip installs it into the venv
        found[canonicalize_name(name)] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return found


def link_shared(dists: dict, folder: Path) -> list:
    """Link each distribution's top-level files and folders (its RECORD) into `folder`; returns the pins."""
    folder.mkdir(parents=True)
    pins = []
    for name, dist in sorted(dists.items()):
        if dist.files is None:
            raise ServingError(f"{name} {dist.version} has no RECORD in this environment; reinstall it with pip")
        base = Path(dist.locate_file(""))
        for top in sorted({f.parts[0] for f in dist.files if f.parts and f.parts[0] not in ("..", "__pycache__")}):
            link = folder / top
            if not link.exists() and (base / top).exists():
                link.symlink_to(base / top)
        pins.append(f"{dist.metadata['Name']}=={dist.version}")
    return pins


def prepare(root: Path | None = None, fresh: bool = False, log=print) -> ServeEnv:
    """The serving environment, made once per environment_key() (a new key removes the old folders)."""
    root = Path(root or cache_dir() / "serving")
    folder = root / environment_key()
    python = folder / "venv" / "bin" / "python"
    marker = folder / "serving.json"
    if not fresh and marker.is_file() and python.exists():
        made = json.loads(marker.read_text())
        log(f"environment: reused {folder}")
        return ServeEnv(folder, python, made["resolved"], made["installed"], 0.0)
    start = time.perf_counter()
    if root.is_dir():
        for old in root.iterdir():
            shutil.rmtree(old, ignore_errors=True)
    folder.mkdir(parents=True)
    log(f"environment 1/4: fastpath's wheel (pip wheel --no-deps) into {folder}")
    wheel = build_wheel(folder / "wheel")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "venv")], check=True)
    log(f"environment 2/4: resolve {wheel.name} + {SERVER} in the empty venv (pip install --dry-run)")
    _pip(python, "install", "--dry-run", "--quiet", "--report", folder / "resolution.json", "-c", CONSTRAINTS,
         wheel, SERVER)
    resolved = _report_versions(folder / "resolution.json")
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     "the venv's site-packages").stdout.strip())
    log(f"environment 3/4: link torch and torchaudio with what they require from {sysconfig.get_paths()['purelib']}")
    pins = link_shared(requirement_closure(SHARED_ROOTS), folder / "shared")
    (folder / "shared-pins.txt").write_text("\n".join(pins) + "\n")
    (site / "zz_fastpath_shared_torch.pth").write_text(f"{folder / 'shared'}\n")
    log(f"environment 4/4: pip install {wheel.name} {SERVER} (torch linked, pinned)")
    _pip(python, "install", "--quiet", "--report", folder / "install.json", "-c", CONSTRAINTS,
         "-c", folder / "shared-pins.txt", wheel, SERVER)
    code = ("import json, importlib.metadata as m, fastpath, omnivoice, torch\n"
            f"print(json.dumps({{**{{n: m.version(n) for n in ({DISTRIBUTION!r}, 'omnivoice', 'omnivoice-server', 'torch')}},\n"
            "    'fastpath_file': fastpath.__file__, 'omnivoice_file': omnivoice.__file__, 'torch_file': torch.__file__}))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    installed = json.loads(_run([python, "-c", code], "importing fastpath, omnivoice and torch in the venv",
                                cwd=folder, env=env).stdout.strip().splitlines()[-1])
    if not Path(installed["fastpath_file"]).is_relative_to(site):
        raise ServingError(f"fastpath imports from {installed['fastpath_file']}, not from the venv's wheel in {site}: "
                           f"delete {folder} and rerun")
    marker.write_text(json.dumps({"resolved": resolved, "installed": installed, "wheel": wheel.name,
                                  "pins": pins}, indent=1))
    seconds = time.perf_counter() - start
    log(f"environment: made in {seconds:.0f} s: omnivoice {installed['omnivoice']}, {SERVER}, fastpath from the wheel")
    return ServeEnv(folder, python, resolved, installed, seconds)


# --- the requests -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    name: str  # the kind of request, as the results name it
    path: str  # route
    body: dict  # JSON body, or the form fields of an upload
    upload: bool = False  # multipart, with the reference clip as `ref_audio`
    stream: bool = False  # read as a stream of PCM pieces


VOICE_FILE = ("studio", "female, young adult, low pitch, british accent\nseed: 4242\nposition_temperature: 5\n")
PROFILE = "narrator"


def plan(reference_text: str) -> list:
    """One request of every kind the server serves. Unseeded ones generate deterministically (the server's
    --position-temperature 0), so they also run at the same time on both workers; seeded ones ask for upstream's
    sampling noise (position_temperature 5), reproducible by the seed (the server seeds torch's global generator
    under a lock, so seeded generations take turns). Every text is different, so that a generation's tokens can be
    matched to their request by its text."""
    noisy = {"position_temperature": 5.0}
    speech = "/v1/audio/speech"
    return [
        Request("auto voice", speech, {"input": "Thank you for calling.", "voice": "auto"}),
        Request("preset voice", speech, {"input": "The museum opens at nine.", "voice": "alloy"}),
        Request("voice design", speech, {"input": "Please leave your name after the tone.",
                                         "instructions": "female, low pitch, british accent", "seed": 11, **noisy}),
        Request("speed", speech, {"input": "The train leaves at half past seven.", "speed": 1.5, "seed": 12, **noisy}),
        Request("duration", speech, {"input": "She opened the window and listened.", "duration": 1.5, "seed": 13,
                                     **noisy}),
        Request("language", speech, {"input": "Our office will be closed on Monday.", "language": "en", "seed": 14,
                                     **noisy}),
        # upstream's own long-text path (_generate_chunked): chunks of 2 s when the estimate is over 2 s
        Request("long text, chunked", speech, {"input": LONG_TEXT, "audio_chunk_duration": 2.0,
                                               "audio_chunk_threshold": 2.0, "seed": 15, **noisy}),
        Request("raw PCM", speech, {"input": "Bicycles travel free in the last carriage.", "response_format": "pcm"}),
        Request("clone upload", "/v1/audio/speech/clone", {"text": "The journey takes about two hours.",
                                                           "ref_text": reference_text, "seed": "16",
                                                           "position_temperature": "5"}, upload=True),
        Request("clone profile", speech, {"input": "Please keep your ticket until the end.",
                                          "voice": f"clone:{PROFILE}"}),
        Request("voice file", speech, {"input": "Visitors may borrow six books.", "voice": VOICE_FILE[0]}),
        # the server's sentence streaming: one generation per sentence (STREAM_CHUNK_MAX_CHARS), PCM as each is made
        Request("PCM stream", speech, {"input": " ".join(STREAM_SENTENCES), "stream": True, "response_format": "pcm",
                                       "seed": 17, **noisy}, stream=True),
        Request("clone PCM stream", "/v1/audio/speech/clone", {
            "text": " ".join(CLONE_STREAM_SENTENCES), "ref_text": reference_text, "stream": "true",
            "response_format": "pcm"}, upload=True, stream=True),
        Request("script, two speakers", "/v1/audio/script", {"script": [
            {"speaker": "host", "text": "Good morning, everyone.", "voice": "alloy"},
            {"speaker": "guest", "text": "Good morning to you too.", "voice": "male, low pitch"}]}),
    ]


def send(base: str, request: Request, reference: bytes) -> dict:
    """One request; its status, the sha256 and size of the body, the seconds it took (to the first piece too)."""
    import requests

    start = time.perf_counter()
    url = base + request.path
    timeout = (10, REQUEST_TIMEOUT)
    try:
        if request.upload:
            response = requests.post(url, data=request.body, files={"ref_audio": ("ref.wav", reference, "audio/wav")},
                                     timeout=timeout, stream=request.stream)
        else:
            response = requests.post(url, json=request.body, timeout=timeout, stream=request.stream)
        pieces, first = [], None
        for piece in response.iter_content(chunk_size=None):
            first = first if first is not None else time.perf_counter() - start
            pieces.append(piece)
        body = b"".join(pieces)
        status, error = response.status_code, "" if response.ok else body[:300].decode(errors="replace")
    except requests.RequestException as err:
        body, status, error, first, pieces = b"", None, f"{type(err).__name__}: {err}", None, []
    return {"name": request.name, "status": status, "error": error, "sha256": hashlib.sha256(body).hexdigest(),
            "bytes": len(body), "pieces": len(pieces), "seconds": round(time.perf_counter() - start, 3),
            "first_piece_s": None if first is None else round(first, 3)}


# --- a server -----------------------------------------------------------------------------------------------

# Run by the venv's python: the recorder first, then the server as its user starts it (the recipe file run as a
# script, or the server's own `python -m omnivoice_server`), with the server's own command line.
DRIVER = """import runpy, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal, whatever the parent ignores
probe, records, target = sys.argv[1:4]
runpy.run_path(probe)["install"](records)
sys.argv = [target, *sys.argv[4:]]
if target == "omnivoice_server":
    runpy.run_module("omnivoice_server", run_name="__main__", alter_sys=True)
else:
    runpy.run_path(target, run_name="__main__")
"""


def recipe_source(doc: Path = DOC) -> str:
    """The recipe's code block, as docs/serving.md shows it."""
    text = doc.read_text()
    if RECIPE_HEADING not in text:
        raise ServingError(f"{doc} has no section {RECIPE_HEADING!r}: the serving check runs its recipe")
    found = re.search(r"```python\n(.*?)```", text.split(RECIPE_HEADING, 1)[1], re.S)
    if found is None:
        raise ServingError(f"{doc}, {RECIPE_HEADING!r}: no ```python block")
    return found.group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerRun:
    label: str
    responses: list = field(default_factory=list)  # send() results, with "round"
    records: list = field(default_factory=list)  # the probe's lines
    timings: dict = field(default_factory=dict)
    log: str = ""
    returncode: int | None = None
    setup: dict = field(default_factory=dict)  # profile creation's response


def serve_and_drive(env: ServeEnv, label: str, target: str, checkpoint: Path, folder: Path, reference: bytes,
                    reference_text: str, say=print) -> ServerRun:
    """Start one server, send every request one at a time and then all at once, stop it with its signal."""
    folder.mkdir(parents=True)
    (folder / "voices").mkdir()
    (folder / "voices" / f"{VOICE_FILE[0]}.txt").write_text(VOICE_FILE[1])
    records = folder / "generations.jsonl"
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", port, "--model", checkpoint, "--device", "cpu", "--num-step", NUM_STEP,
            "--max-concurrent", WORKERS, "--position-temperature", 0, "--no-detect-no-speech", "--no-web-ui",
            "--profile-dir", folder / "profiles", "--voice-dir", folder / "voices", "--timeout", REQUEST_TIMEOUT,
            "--shutdown-timeout", 10, "--log-level", "info"]
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("OMNIVOICE_")}
    environ.update(HOME=str(folder), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONNOUSERSITE="1",
                   PYTHONUNBUFFERED="1", OMNIVOICE_STREAM_CHUNK_MAX_CHARS=str(STREAM_CHUNK_MAX_CHARS))
    run = ServerRun(label)
    log_path = folder / "server.log"
    base = f"http://127.0.0.1:{port}"
    requests_plan = plan(reference_text)
    with open(log_path, "w") as log_file:
        t0 = time.perf_counter()
        proc = subprocess.Popen([str(env.python), "-c", DRIVER, str(PROBE), str(records), target, *map(str, args)],
                                cwd=folder, env=environ, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while "OMNIVOICE_READY" not in log_path.read_text():
                if proc.poll() is not None:
                    raise ServingError(f"the {label} server exited ({proc.returncode}) before it was ready; its log, "
                                       f"{log_path}:\n{log_path.read_text()[-3000:]}")
                if time.perf_counter() - t0 > START_TIMEOUT:
                    raise ServingError(f"the {label} server was not ready after {START_TIMEOUT} s; {log_path}")
                time.sleep(0.5)
            run.timings["start_s"] = round(time.perf_counter() - t0, 1)
            run.timings["load_1min"] = round(os.getloadavg()[0], 1)  # what else the machine was running
            say(f"{label}: ready on {base} in {run.timings['start_s']:.0f} s")
            run.setup = _create_profile(base, reference, reference_text)
            t1 = time.perf_counter()
            for request in requests_plan:
                run.responses.append({**send(base, request, reference), "round": "one at a time"})
            run.timings["sequential_s"] = round(time.perf_counter() - t1, 1)
            say(f"{label}: {len(requests_plan)} requests one at a time in {run.timings['sequential_s']:.0f} s")
            t2 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(CLIENTS, thread_name_prefix="client") as pool:
                futures = [pool.submit(send, base, request, reference) for request in requests_plan]
                run.responses += [{**f.result(), "round": "all at once"} for f in futures]
            run.timings["concurrent_s"] = round(time.perf_counter() - t2, 1)
            say(f"{label}: {len(requests_plan)} requests all at once ({CLIENTS} clients) in "
                f"{run.timings['concurrent_s']:.0f} s")
            t3 = time.perf_counter()
            proc.send_signal(SIGNALS[label])
            run.returncode = proc.wait(timeout=STOP_TIMEOUT)
            run.timings["stop_s"] = round(time.perf_counter() - t3, 1)
        finally:
            if proc.poll() is None:  # only a failure above leaves it running
                proc.kill()
                proc.wait(timeout=60)
    run.log = log_path.read_text()
    run.records = [json.loads(line) for line in records.read_text().splitlines()] if records.is_file() else []
    return run


def _create_profile(base: str, reference: bytes, reference_text: str) -> dict:
    import requests

    response = requests.post(f"{base}/v1/voices/profiles", data={"profile_id": PROFILE, "ref_text": reference_text},
                             files={"ref_audio": ("ref.wav", reference, "audio/wav")}, timeout=(10, 120))
    return {"status": response.status_code, "body": response.text[:300]}


# --- the comparison -----------------------------------------------------------------------------------------


def overlapping(records: list) -> int:
    """Pairs of generations on different workers that ran at the same time."""
    count = 0
    for i, a in enumerate(records):
        for b in records[i + 1:]:
            if a["thread"] != b["thread"] and a["start"] < b["end"] and b["start"] < a["end"]:
                count += 1
    return count


def tokens_by_text(records: list) -> dict:
    out: dict = {}
    for r in records:
        out.setdefault(r["text"], []).append(r["tokens"])
    return {text: sorted(tokens) for text, tokens in out.items()}


def log_problems(log: str) -> list:
    return [line for line in log.splitlines() if LOG_PROBLEMS.search(line)]


def compare(stock: ServerRun, patched: ServerRun, expected_patches: list) -> tuple:
    """(figures, problems): fastpath's server against stock's, each problem a sentence naming what differs."""
    problems = []
    for run in (stock, patched):
        if run.setup.get("status") != 201:
            problems.append(f"{run.label}: creating the voice profile gave {run.setup}")
        problems += [f"{run.label}: {r['name']} ({r['round']}): {r['status']} {r['error']}" for r in run.responses
                     if r["status"] != 200 and not (r["name"] in STOCK_FAILS and STOCK_FAILS[r["name"]] in r["error"])]
        problems += [f"{run.label} log: {line}" for line in log_problems(run.log)]
        expected = EXIT_STATUS[SIGNALS[run.label]]
        if run.returncode != expected:
            problems.append(f"{run.label}: exit status {run.returncode} after {SIGNALS[run.label].name}, not {expected}")
        for needed in ("Shutting down...", "Done.", "Application shutdown complete.", "Finished server process"):
            if needed not in run.log:
                problems.append(f"{run.label}: the log does not say {needed!r}: the server's shutdown did not finish")
    pairs = list(zip(stock.responses, patched.responses))
    same = [a for a, b in pairs if a["sha256"] == b["sha256"] and a["status"] == b["status"]]
    problems += [f"{a['name']} ({a['round']}): fastpath's {b['status']}, {b['bytes']} bytes differ from stock's "
                 f"{a['status']}, {a['bytes']} bytes" for a, b in pairs if a not in same]
    stock_tokens, patched_tokens = tokens_by_text(stock.records), tokens_by_text(patched.records)
    texts = sorted(set(stock_tokens) | set(patched_tokens))
    same_tokens = [t for t in texts if stock_tokens.get(t) == patched_tokens.get(t)]
    problems += [f"generation of {t!r}: fastpath's tokens differ from stock's" for t in texts if t not in same_tokens]
    half = len(stock.responses) // 2
    repeats = {run.label: sum(a["sha256"] == b["sha256"] for a, b in zip(run.responses[:half], run.responses[half:]))
               for run in (stock, patched)}
    applied = {run.label: sorted({tuple(r["applied"] or ()) for r in run.records}) for run in (stock, patched)}
    if applied["fastpath"] != [tuple(expected_patches)]:
        problems.append(f"the fastpath server's model had {applied['fastpath']} applied, not {expected_patches}")
    if applied["stock"] != [()]:
        problems.append(f"the stock server's model had {applied['stock']} applied")
    figures = {
        "responses": len(pairs), "same_bytes": len(same), "generations": len(texts), "same_tokens": len(same_tokens),
        "repeats": repeats, "stock_fails": {r["name"]: r["error"] for r in stock.responses if r["status"] != 200},
        "applied": list(applied["fastpath"][0]) if len(applied["fastpath"]) == 1 else applied["fastpath"],
    }
    return figures, problems


def coverage(run: ServerRun) -> list:
    """What the plan must have reached in a server: generations at the same time on different workers, upstream's
    chunked path for the long text, one generation per sentence of each stream (both rounds)."""
    problems = []
    run.timings["overlapping"] = overlapping(run.records)  # the round one at a time has none
    if run.timings["overlapping"] == 0:
        problems.append(f"{run.label}: no two generations ran at the same time on its {WORKERS} workers")
    chunks = [len(r["tokens"]) for r in run.records if r["text"] == LONG_TEXT]
    if len(chunks) != 2 or min(chunks) < 2:
        problems.append(f"{run.label}: the long text was not generated in chunks (token tensors per generation of "
                        f"it: {chunks})")
    texts = [r["text"] for r in run.records]
    for sentence in STREAM_SENTENCES + CLONE_STREAM_SENTENCES:
        if texts.count(sentence) != 2:
            problems.append(f"{run.label}: the stream sentence {sentence!r} was generated {texts.count(sentence)} "
                            f"times on its own, not once per round")
    return problems


def check(env: ServeEnv, checkpoint: Path, folder: Path, say=print) -> dict:
    """Both servers, the same requests, the comparison: a report whose `problems` is empty when it passed."""
    import fastpath

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    recipe = folder / "serve_fastpath.py"
    recipe.write_text(recipe_source())
    reference, reference_text = REFERENCE.with_suffix(".wav").read_bytes(), REFERENCE.with_suffix(".txt").read_text().strip()
    runs = {}
    for label, target in (("stock", "omnivoice_server"), ("fastpath", str(recipe))):
        runs[label] = serve_and_drive(env, label, target, checkpoint, folder / label, reference, reference_text, say)
    figures, problems = compare(runs["stock"], runs["fastpath"], list(fastpath.LOSSLESS))
    problems += coverage(runs["stock"]) + coverage(runs["fastpath"])
    kinds = [r.name for r in plan(reference_text)]
    report = {
        "server": SERVER, "versions": {k: env.installed[k] for k in ("omnivoice", "omnivoice-server", DISTRIBUTION,
                                                                     "torch")},
        "resolved": {k: env.resolved.get(k) for k in ("omnivoice", "omnivoice-server", DISTRIBUTION, "torch")},
        "environment_s": round(env.seconds, 1), "kinds": kinds, "workers": WORKERS, "clients": CLIENTS,
        "num_step": NUM_STEP, "checkpoint": Path(checkpoint).name,
        "servers": {label: {**run.timings, "signal": SIGNALS[label].name, "exit": run.returncode,
                            "generations": len(run.records),
                            "requests": [{k: r[k] for k in ("name", "round", "status", "bytes", "seconds",
                                                            "first_piece_s")} for r in run.responses]}
                    for label, run in runs.items()},
        **figures, "problems": problems,
    }
    (folder / "report.json").write_text(json.dumps(report, indent=1))
    return report


# --- the command --------------------------------------------------------------------------------------------


def render_results(figures: dict) -> str:
    """The results section: per server its start, both rounds and its stop; then what was equal."""
    n = len(figures["kinds"])
    def message(error: str) -> str:
        try:
            return json.loads(error)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            return error

    lines = [f"`{figures['server']}` from the package index with omnivoice {figures['versions']['omnivoice']} (what "
             f"pip resolved beside fastpath's wheel), the tiny test checkpoint at {figures['num_step']} steps, "
             f"{figures['workers']} inference workers; {n} kinds of request ({'; '.join(figures['kinds'])}), each "
             f"sent once one at a time and once all at once from {figures['clients']} client threads.", "",
             "Seconds of wall time on the machine below, with what else ran on it (its 1-minute load average when "
             "each server was ready): a record of the run, not a speed comparison (`fastpath-suite bench` is one). Stop: from the "
             "signal to the exit (after SIGTERM the process ends by the signal once its shutdown is done; after "
             "SIGINT the interpreter finishes as usual).", "",
             "| server | load | start (s) | one at a time (s) | all at once (s) | generations | of them overlapping | "
             "stop | stop (s) | exit |", "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for label, s in figures["servers"].items():
        lines.append(f"| {label} | {s.get('load_1min', '')} | {s['start_s']:.1f} | {s['sequential_s']:.1f} | {s['concurrent_s']:.1f} | "
                     f"{s['generations']} | {s['overlapping']} pairs | {s['signal']} | {s['stop_s']:.1f} | "
                     f"{s['exit']} |")
    lines += ["", f"Responses byte for byte equal to stock's: {figures['same_bytes']} of {figures['responses']}; "
                  f"generations (texts) with stock's tokens: {figures['same_tokens']} of {figures['generations']}; "
                  f"patches applied by the recipe: {', '.join(figures['applied'])}. "
                  + "".join(f"Stock fails {name!r} too ({message(error)}): fastpath's response is the same. "
                            for name, error in sorted(figures["stock_fails"].items()))
                  + f"Problems: "
                  f"{len(figures['problems'])}" + (": " + "; ".join(figures["problems"]) if figures["problems"] else
                                                   ".")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fastpath-suite serve-check", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "out" / "serving",
                        help="folder for the servers' logs, their generations and report.json (emptied first)")
    parser.add_argument("--fresh", action="store_true", help="make the environment under .cache/serving/ again")
    result_files.add_arguments(parser)
    args = parser.parse_args(argv)
    args.out = args.out.resolve()  # each server runs in its own folder under it: a relative path would be read there
    progress = Progress("serve-check", quiet=args.quiet)
    shutil.rmtree(args.out, ignore_errors=True)
    try:
        env = prepare(fresh=args.fresh, log=progress.say)
        report = check(env, build_checkpoint("tiny"), args.out, say=progress.say)
    except ServingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(render_results(report))
    print(f"written: {args.out / 'report.json'}")
    result_files.write_if_asked(args, "serving", report)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
