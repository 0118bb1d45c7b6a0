"""The nightly history: every night's raw speed samples of one machine and one signal, kept as one JSON file.

A history is what a nightly workflow keeps between runs (as an artifact, or committed to a branch)::

    {
      "format": "fastpath-speed-history", "format_version": 2,
      "machine_key": "cpu-amd-epyc-avx2-2c-2t",
      "nights": [
        {"id": "3f2c9a01b7de", "date": "2026-12-01T03:17:02Z", "commit": "9b1e...", "command": "...",
         "versions": {"fastpath": "0.1.0", "omnivoice": "0.2.1", "torch": "2.14.1-cu130", "transformers": "5.24.0"},
         "machine": {...machine_info, with the night's device_key...}, "sources": ["out/wall.json"],
         "points": {"auto-short-10": {"metric": "rtf", "samples": [0.41, 0.40, ...], "extra": {...}}}}
      ],
      "accepted": [{"point": "auto-short-10", "night": "3f2c9a01b7de", "date": "...", "reason": "..."}],
      "not_judged_limit": 7
    }

A night is one run (a pytest-benchmark ``--benchmark-json`` file or a speed baseline, several files when one night
measured in several processes); its id is a digest of its commit, date and samples, so importing the same run twice
changes nothing. A history holds one machine: a run's device key (harness.run.machine.device_key) is split by
``split_key`` into the machine (the part before its first ``__``: the hardware, the instruction counts' CPU
capability, or ``structure``) and the software versions (torch and omnivoice; valgrind's version for instruction
counts). Speed only compares on one machine, so a run measured on another is refused with the fix; a night with
other versions on the same machine is appended, and records them (``versions``: the key's, then every package the
machine info records): the change of versions from one night to the next is an event on the history
(``History.version_changes``), the rule judges a step at it as any step, and names the versions as its likely cause.
Starting a new history is deliberate (``append --new-history``, which keeps the old file beside the new one). A
file of format 1 (keyed by the whole device key, versions included) is read as format 2: its key's machine part is
the machine, and each night's versions are those its own device key and machine info name; the next append writes
it as format 2. (A key in an older form, such as the instruction counts' key that once named the processor's
vendor, is read as today's: harness.counts.instructions.migrated_key.) ``accepted`` lists the slowdowns a person
has accepted (a deliberate trade, a new compiler): the rule (harness.nightly.changes) then takes the new level as the
normal one. ``not_judged_limit`` is how many nights in a row the history's wall time may go not judged (measured
beside competing work) before a night fails for it: ``NOT_JUDGED_LIMIT`` unless set with `nightly append
--not-judged-limit N` (a file without it, written before it existed, has the default).

Every problem (a missing, corrupt or foreign file, another machine, a night's points measured twice) raises
HistoryError with the fix; the file is written atomically, so a killed job leaves the previous history.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from harness.nightly.versions import changed_versions
from harness.speed.baselines import FORMAT as BASELINE_FORMAT
from harness.speed.baselines import BaselineError, check_samples, migrated_key, read_json, read_run, write_atomic

FORMAT = "fastpath-speed-history"
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)  # 1: keyed by the whole device key, versions included (read as 2: load_history)
# nights in a row a history's wall time may go not judged (busy) before a night fails for it: a slowdown landing in
# a busy stretch is judged on the first quiet night, or the stretch itself fails the nightly within a week
NOT_JUDGED_LIMIT = 7


class HistoryError(BaselineError):
    """A history file or a run to append is missing, corrupt, foreign or for another machine; the message says the
    fix."""


# an instruction count's machine part names valgrind's version (instructions.device_key): a version, not a machine
CALLGRIND = re.compile(r"^callgrind-(?P<valgrind>[^-_]+)-(?P<capability>.+)$")


def split_key(key: str) -> tuple:
    """(machine, {package: version}) of a device key: the part before its first ``__`` is the machine, each later
    ``name-version`` part a package's version (``cpu-amd-epyc-avx2-2c-2t__torch-2.14.1-cu130__omnivoice-0.2.1``:
    ``cpu-amd-epyc-avx2-2c-2t``, torch ``2.14.1-cu130``, omnivoice ``0.2.1``); an instruction count's valgrind
    version moves from the machine part to the versions. A key in an older form is read as today's."""
    machine, *software = migrated_key(key).split("__")
    versions = dict(part.partition("-")[::2] for part in software)
    found = CALLGRIND.match(machine)
    if found:
        machine, versions = f"callgrind-{found['capability']}", {"valgrind": found["valgrind"], **versions}
    return machine, versions


def night_versions(key: str, machine: dict) -> dict:
    """The software a night ran on: the versions its device key names, and every other package its machine info
    records (transformers, the patches' own distribution) as recorded; "none" where one was not installed."""
    keyed = split_key(key)[1]
    recorded = {name: "none" if v is None else str(v) for name, v in ((machine or {}).get("versions") or {}).items()}
    return dict(sorted({**recorded, **keyed}.items()))


@dataclass(frozen=True)
class Night:
    """One nightly run: where and when, and the raw samples of every point it measured."""

    id: str
    date: str
    commit: str | None
    command: str | None
    machine: dict
    points: dict  # name -> {"metric": str, "samples": [float, ...], "extra": {...}}
    sources: tuple = ()
    labels: tuple = ()  # what the person who appended it said of the night, e.g. "busy-core"
    versions: dict = field(default_factory=dict)  # package -> version the night ran on (night_versions)

    def median(self, point: str) -> float | None:
        entry = self.points.get(point)
        return float(np.median(entry["samples"])) if entry else None

    def as_dict(self) -> dict:
        return {"id": self.id, "date": self.date, "commit": self.commit, "command": self.command,
                "versions": self.versions, "machine": self.machine, "sources": list(self.sources),
                "labels": list(self.labels), "points": self.points}


@dataclass
class History:
    machine_key: str  # the machine every night was measured on (split_key); the versions are each night's
    nights: list = field(default_factory=list)
    accepted: list = field(default_factory=list)
    path: Path | None = None
    not_judged_limit: int = NOT_JUDGED_LIMIT  # nights in a row not judged before a night fails for it
    set_aside: Path | None = None  # where `append --new-history` kept the history this one replaced (not stored)

    @property
    def device_key(self) -> str:
        """The latest night's device key (the machine and tonight's versions); the machine key while empty."""
        return (self.nights[-1].machine.get("device_key") if self.nights else None) or self.machine_key

    def version_changes(self) -> list:
        """(position, night, ["torch 2.14.1 -> 2.15.0", ...]) for each night whose versions differ from the night
        before it: the events a change of versions makes on the history."""
        return [(i, night, changed) for i, (before, night) in enumerate(zip(self.nights, self.nights[1:]), 1)
                if (changed := changed_versions(before.versions, night.versions))]

    @property
    def point_names(self) -> list:
        """Every point any night measured, in the order they first appeared."""
        names: dict = {}
        for night in self.nights:
            names.update(dict.fromkeys(night.points))
        return list(names)

    def series(self, point: str) -> tuple:
        """(nights that measured ``point``, their log medians) in night order."""
        nights = [n for n in self.nights if point in n.points]
        return nights, np.log([n.median(point) for n in nights])

    def as_dict(self) -> dict:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "machine_key": self.machine_key,
                "nights": [n.as_dict() for n in self.nights], "accepted": self.accepted,
                "not_judged_limit": self.not_judged_limit}


def night_id(date: str, commit: str | None, points: dict) -> str:
    """Digest of what makes a run the same run: its commit, its date and every sample."""
    body = json.dumps({"date": date, "commit": commit,
                       "points": {k: [points[k]["metric"], points[k]["samples"]] for k in sorted(points)}},
                      sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:12]


def run_machine(data: dict) -> dict:
    """The machine description a run file carries: a baseline's ``machine``, or the ``fastpath`` part of a
    pytest-benchmark file's machine_info (written by the suite's machine-info hook) with pytest-benchmark's CPU."""
    if data.get("format") == BASELINE_FORMAT:
        return dict(data.get("machine") or {})
    info = data.get("machine_info") or {}
    ours = dict(info.get("fastpath") or {})
    ours.setdefault("node", info.get("node"))
    return ours


def night_from_files(paths: list, labels=()) -> Night:
    """One night from the run files one nightly job wrote (their points may not overlap, their device key must agree)."""
    if not paths:
        raise HistoryError("no run file given: pass the nightly's --benchmark-json file(s)")
    points, keys, commits, dates, commands, machine = {}, set(), set(), [], [], {}
    for path in paths:
        data = read_json(Path(path), "Pass a pytest-benchmark --benchmark-json file or a speed baseline.")
        run = read_run(data, str(path))
        if not run.device_key:
            raise HistoryError(
                f"{path} names no device key, so it cannot join a history of one device. Write it with this suite's "
                "pytest (its machine-info hook adds machine_info['fastpath']['device_key']) or `fastpath-suite bench "
                "--save-baseline`.")
        keys.add(migrated_key(run.device_key))
        commits.add(run.commit)
        dates.append(run.created_utc or "")
        commands.append(run.command or "")
        machine = machine or run_machine(data)
        for name, p in run.points.items():
            if name in points:
                raise HistoryError(f"point {name!r} is in more than one of {list(map(str, paths))}: one night measures "
                                   "a point once. Append the files as separate nights, or drop one.")
            points[name] = {"metric": p.metric, "samples": list(p.samples), "extra": p.extra}
    if len(keys) > 1:
        raise HistoryError(f"the files of one night were measured on different device keys {sorted(keys)}; a night "
                           "is one machine. Append each to its own device's history.")
    if len(commits) > 1:
        raise HistoryError(f"the files of one night are from different commits {sorted(map(str, commits))}; append "
                           "them as separate nights.")
    date = min(d for d in dates if d) if any(dates) else datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    commit, key = commits.pop(), keys.pop()
    return Night(id=night_id(date, commit, points), date=date, commit=commit,
                 command=" ; ".join(dict.fromkeys(c for c in commands if c)) or None,
                 machine={**machine, "device_key": key}, points=points,
                 sources=tuple(str(p) for p in paths), labels=tuple(labels), versions=night_versions(key, machine))


def check_night(raw: object, where: str, fix: str) -> Night:
    if not isinstance(raw, dict):
        raise HistoryError(f"{where} is {type(raw).__name__}, expected an object. {fix}")
    missing = [k for k in ("id", "date", "points") if k not in raw]
    if missing:
        raise HistoryError(f"{where} lacks {missing}. {fix}")
    points = raw["points"]
    if not isinstance(points, dict) or not points:
        raise HistoryError(f"{where} has no points. {fix}")
    for name, entry in points.items():
        if not isinstance(entry, dict) or "samples" not in entry:
            raise HistoryError(f"{where}: point {name!r} has no samples. {fix}")
        metric = str(entry.get("metric", "rtf"))
        entry["samples"] = list(check_samples(entry["samples"], f"{where}: point {name!r}", fix, metric))
        entry["metric"] = metric
    expected = night_id(raw["date"], raw.get("commit"), points)
    if raw["id"] != expected:
        raise HistoryError(f"{where}: id {raw['id']!r} does not match its samples (digest {expected!r}); the history "
                           f"was edited by hand. {fix}")
    versions = raw.get("versions")
    if not isinstance(versions, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in versions.items()):
        raise HistoryError(f"{where} lacks its versions (an object of package -> version strings), so a change of "
                           f"versions could not be seen. {fix}")
    return Night(id=raw["id"], date=str(raw["date"]), commit=raw.get("commit"), command=raw.get("command"),
                 machine=dict(raw.get("machine") or {}), points=points, sources=tuple(raw.get("sources") or ()),
                 labels=tuple(raw.get("labels") or ()), versions=dict(versions))


def from_format_1(data: dict) -> dict:
    """A format-1 history (keyed by the whole device key, versions included) as format 2: the key's machine part
    is the machine; each night's versions are those its own device key (else the file's) and machine info name."""
    def with_versions(raw):
        machine = (raw.get("machine") or {}) if isinstance(raw, dict) else None
        if not isinstance(machine, dict):
            return raw  # check_night names what is wrong with it
        return dict(raw, versions=night_versions(str(machine.get("device_key") or data["device_key"]), machine))

    nights = [with_versions(raw) for raw in data["nights"]]
    return {**data, "format_version": FORMAT_VERSION, "machine_key": split_key(data["device_key"])[0],
            "nights": nights}


def load_history(path: str | os.PathLike) -> History:
    """Read and validate a history file; HistoryError naming the fix for anything else."""
    path = Path(path)
    fix = (f"Restore {path} from the last nightly's artifact (or its branch), or move it away to start a new "
           "history with `fastpath-suite nightly append`.")
    if not path.exists():
        raise HistoryError(f"no history at {path}. Start one with: fastpath-suite nightly append {path} "
                           "out/wall.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HistoryError(f"{path} is not readable JSON ({err}): truncated or corrupt. {fix}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise HistoryError(f"{path} is not a fastpath speed history (format={found!r}, expected {FORMAT!r}); a "
                           f"foreign file (a run file? append it to a history instead). {fix}")
    if data.get("format_version") not in READ_VERSIONS:
        raise HistoryError(f"{path} has format_version {data.get('format_version')!r}; this suite reads "
                           f"{' and '.join(map(str, READ_VERSIONS))}. Use the suite version that wrote it. {fix}")
    if data["format_version"] == 1:
        if not isinstance(data.get("device_key"), str) or not isinstance(data.get("nights"), list):
            raise HistoryError(f"{path} (format 1) lacks its device_key or its nights list. {fix}")
        data = from_format_1(data)
    if not isinstance(data.get("machine_key"), str) or not isinstance(data.get("nights"), list):
        raise HistoryError(f"{path} lacks its machine_key or its nights list. {fix}")
    try:
        nights = [check_night(raw, f"{path}: night {i}", fix) for i, raw in enumerate(data["nights"])]
    except HistoryError:
        raise
    except BaselineError as err:  # a sample check of baselines.check_samples
        raise HistoryError(str(err)) from None
    ids = [n.id for n in nights]
    if len(set(ids)) != len(ids):
        raise HistoryError(f"{path} holds the same night twice; it was merged by hand. {fix}")
    accepted = data.get("accepted") or []
    if not isinstance(accepted, list) or any(not isinstance(a, dict) or not {"point", "night"} <= set(a)
                                             for a in accepted):
        raise HistoryError(f"{path}: 'accepted' must be a list of {{point, night, reason}}. {fix}")
    limit = data.get("not_judged_limit", NOT_JUDGED_LIMIT)
    try:
        limit = check_limit(limit)
    except ValueError as err:
        raise HistoryError(f"{path}: {err}. {fix}") from None
    return History(machine_key=data["machine_key"], nights=nights, accepted=accepted, path=path,
                   not_judged_limit=limit)


def check_limit(limit) -> int:
    """A limit on nights in a row not judged: a whole number, 0 or more (0: every busy night fails), else
    ValueError naming it."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"not_judged_limit {limit!r} is not a whole number of nights, 0 or more (default "
                         f"{NOT_JUDGED_LIMIT})")
    return limit


def save_history(history: History, path: str | os.PathLike) -> None:
    """Write atomically (temp file beside it, fsync, rename)."""
    write_atomic(Path(path), json.dumps(history.as_dict(), indent=1, allow_nan=False) + "\n")


def set_aside(path: Path) -> Path | None:
    """Move the history at ``path`` (if any) beside itself, as <name>.before-<UTC time>.json, so that a new one starts
    there; the kept path, or None when there was none. Never overwrites a file."""
    if not path.exists():
        return None
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    kept = path.with_name(f"{path.stem}.before-{stamp}{path.suffix}")
    if kept.exists():
        raise HistoryError(f"{kept} exists already; move it away, then start the new history again")
    path.rename(kept)
    return kept


def append(path: str | os.PathLike, run_files: list, labels=(), not_judged_limit: int | None = None,
           new_history: bool = False) -> tuple:
    """Append one night (from ``run_files``) to the history at ``path``, creating it when missing; with
    ``not_judged_limit``, set the history's limit on nights in a row not judged (kept in the file). A night of the
    history's machine with other versions is appended (the change is an event: History.version_changes); a night of
    another machine is refused. ``new_history``: start a new history at ``path`` on purpose, the old file kept beside
    it (``History.set_aside``).

    Returns (history, added): added is the night appended, None when it was already there (the file is then left
    untouched, unless the limit changed). Nights are kept in date order, so a late import lands where it belongs.
    """
    path = Path(path)
    night = night_from_files(run_files, labels)
    key = night.machine["device_key"]
    machine = split_key(key)[0]
    kept = set_aside(path) if new_history else None
    history = load_history(path) if path.exists() else History(machine_key=machine, path=path)
    history.set_aside = kept
    limit_changed = not_judged_limit is not None and check_limit(not_judged_limit) != history.not_judged_limit
    if limit_changed:
        history.not_judged_limit = not_judged_limit
    if machine != history.machine_key:
        runs = " ".join(map(str, run_files))
        raise HistoryError(
            f"{runs} was measured on machine {machine!r} (device key {key!r}), but {path} is the history of machine "
            f"{history.machine_key!r}: speed only compares on one machine (new versions of torch, omnivoice or any "
            "package on the same machine are not refused: the night records them, an event on the history). Append "
            "it to that machine's own history (a file that does not exist yet starts one), or start a new history "
            f"here on purpose: `fastpath-suite nightly append {path} {runs} --new-history` (the old file is kept "
            "beside it).")
    if any(n.id == night.id for n in history.nights):
        if limit_changed:
            save_history(history, path)
        return history, None
    history.nights.append(night)
    history.nights.sort(key=lambda n: n.date)
    save_history(history, path)
    return history, night


def accept(path: str | os.PathLike, point: str, night: str, reason: str) -> History:
    """Record that the slowdown (or changed mix of exact counts) of ``point`` that began on ``night`` (its id) is
    accepted, with the reason. Refused unless the rule found such a change of that point beginning on that night.
    Once recorded, the point's nights from ``night`` on are its new reference, whatever night a later run of the
    rule (more points, another alpha) places the change on."""
    from harness.nightly.changes import ALARM_KINDS, check_history

    history = load_history(path)
    if point not in history.point_names:
        raise HistoryError(f"{path} has no point {point!r}; its points are {history.point_names}")
    if night not in {n.id for n in history.nights}:
        raise HistoryError(f"{path} has no night {night!r}; `fastpath-suite nightly check {path}` lists each "
                           "alarm with the night its change began")
    if not reason.strip():
        raise HistoryError("give the reason the slowdown is accepted (--reason): it is kept in the history")
    report = next(r for r in check_history(history) if r.point == point)
    began = {report.nights[e.began].id: e for e in report.trace.events if e.kind in ALARM_KINDS}
    if night not in began:
        found = ", ".join(f"{i} ({report.nights[e.began].date[:10]}, {e.status})" for i, e in began.items())
        raise HistoryError(f"no slowdown of {point} began on night {night} (nor a changed mix of its exact counts), "
                           "so there is nothing there to accept; "
                           f"{'its slowdowns began on: ' + found if found else 'the rule found no slowdown of it'} "
                           f"(`fastpath-suite nightly check {path}` lists them)")
    entry = {"point": point, "night": night, "reason": reason,
             "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if not any(a["point"] == point and a["night"] == night for a in history.accepted):
        history.accepted.append(entry)
        save_history(history, path)
    return history


NOT_JUDGED = 3  # exit status: tonight's wall time was measured beside competing work (as `compare`'s unstable)


def check(args) -> int:
    """Run the rule over each history (one per signal: wall time, instructions, exact counts); print the summaries,
    write the page; exit 1 on an open slowdown (or changed mix) or when tonight ends a streak of nights not judged
    longer than the history's limit, 3 when tonight's wall time is not judged (and nothing fails), else 0. Each
    statistical history spends alpha / ``args.statistical_histories``, whatever number of files one call is given."""
    from harness.nightly.changes import STATISTICAL_HISTORIES, check_history, is_statistical
    from harness.nightly.dashboard import page_html, summary_markdown

    histories = [load_history(path) for path in args.history]
    for history in histories:
        if not history.nights:
            raise HistoryError(f"{history.path} has no nights yet; append tonight's run first")
    statistical = [h for h in histories if is_statistical(h)]
    if len(statistical) > args.statistical_histories:
        declared = (f"the {len(STATISTICAL_HISTORIES)} the suite declares ({', '.join(STATISTICAL_HISTORIES)})"
                    if args.statistical_histories == len(STATISTICAL_HISTORIES) else
                    f"--statistical-histories {args.statistical_histories}")
        raise HistoryError(
            f"{len(statistical)} histories judged with noise in one call "
            f"({', '.join(str(h.path) for h in statistical)}) but the suite's alpha is split over {declared}: that would spend more than the suite's budget. Pass "
            f"--statistical-histories N with N the number of statistical histories the whole suite keeps (every "
            "runner's check the same N), or check fewer files.")
    sections = [(h, check_history(h, args.alpha, args.statistical_histories)) for h in histories]
    text = "\n".join(summary_markdown(history, reports) for history, reports in sections)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.md").write_text(text)
        (args.out / "index.html").write_text(page_html(sections))
        alarms = [{"history": str(h.path), "point": r.point, "metric": r.metric, "kind": e.kind,
                   "began": r.nights[e.began].id, "began_date": r.nights[e.began].date,
                   "commit": r.nights[e.began].commit, "change": e.change, "rule": e.rule, "detail": e.detail,
                   "versions": e.versions}
                  for h, reports in sections for r in reports for e in r.trace.open]
        alarms += [{"history": str(h.path), "point": r.point, "metric": r.metric, "kind": "not judged",
                    "began": r.nights[-r.not_judged_streak].id, "began_date": r.nights[-r.not_judged_streak].date,
                    "commit": r.nights[-r.not_judged_streak].commit, "change": None, "rule": "not-judged limit",
                    "detail": [r.not_judged.get(len(r.x) - 1, "")], "streak": r.not_judged_streak,
                    "limit": r.not_judged_limit}
                   for h, reports in sections for r in reports if r.over_limit]
        (args.out / "alarms.json").write_text(json.dumps(alarms, indent=1) + "\n")
        print(f"written: {args.out / 'summary.md'}, {args.out / 'index.html'}, {args.out / 'alarms.json'}")
    for line in bisect_commands(sections):
        print(line)
    reports = [r for _, rs in sections for r in rs]
    if any(r.trace.open or r.over_limit for r in reports):
        return 1
    return NOT_JUDGED if any(r.status == "not judged" for r in reports) else 0


BISECT_SIGNALS = {"instructions": "instructions", "ops": "structure"}  # a count history's metric -> bisect's signal


def bisect_commands(sections) -> list[str]:
    """For each open change of a count history: the bisect command over its night's commits (the night before it
    to the night it began), so a flagged night is traced to its commit. Wall-time points are not counting points:
    their line names the counting command to bisect with instead."""
    from harness.nightly.bisect import command_for

    lines = []
    for _, reports in sections:
        for r in reports:
            for e in r.trace.open:
                began, before = r.nights[e.began], r.nights[e.began - 1] if e.began > 0 else None
                if before is None or not before.commit or not began.commit or before.commit == began.commit:
                    lines.append(f"bisect {r.point}: the nights give no range of commits (night {began.id}: "
                                 f"{began.commit or 'no commit recorded'})")
                    continue
                good, bad = before.commit.removesuffix("-dirty"), began.commit.removesuffix("-dirty")
                signal = BISECT_SIGNALS.get(r.metric)
                if signal:
                    point, _, variant = r.point.partition("/")
                    lines.append(f"bisect {r.point}: {command_for(good, bad, point, signal)}"
                                 + (f" --variant {variant}" if variant and variant != "lossless" else ""))
                else:
                    lines.append(f"bisect {r.point}: a wall-time point; count its work over the range with "
                                 f"{command_for(good, bad, 'POINT', 'instructions')} (a counting point: "
                                 f"fixtures/points.json 'counts')")
    return lines


def rates(argv) -> int:
    """`fastpath-suite nightly rates`: the rule's operating characteristics on recorded nights (history_rates)."""
    import argparse

    from harness.run import results
    from harness.run.progress import Progress
    from harness.nightly import history_rates

    parser = argparse.ArgumentParser(prog="fastpath-suite nightly rates",
                                     description=history_rates.__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("recorded", nargs="?", default=str(history_rates.RECORDED),
                        help="a recorded history (repeated runs), or any history whose points every night measured")
    parser.add_argument("--histories", type=int, default=400, help="simulated histories per row")
    parser.add_argument("--seed", type=int, default=0)
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        history = load_history(args.recorded)
        rec = history_rates.recorded_from(history)
    except (HistoryError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    metrics = {history.nights[0].points[p]["metric"] for p in rec.points}
    progress = Progress("nightly rates", args.quiet)
    progress.say(f"{rec.runs} recorded runs of {len(rec.points)} points ({', '.join(sorted(metrics))}), "
                 f"{args.histories} simulated histories a row")
    if metrics == {"instructions"}:
        fig = history_rates.measure_counts(rec, "instructions", args.histories, args.seed, progress)
        kind, text = "history-rates-instructions", history_rates.render_count_results
    else:
        fig = history_rates.measure(rec, args.histories, args.seed, progress)
        kind, text = "history-rates", history_rates.render_results
    fig["recorded"] = str(args.recorded)
    print(text(fig))
    results.write_if_asked(args, kind, fig)
    return 0


def alpha_option(text: str) -> float:
    import argparse

    from harness.nightly.changes import check_alpha

    try:
        return check_alpha(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def count_option(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number, 0 or more")
    return value


def histories_option(text: str) -> int:
    import argparse

    value = count_option(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the suite's alpha is split over at least one history")
    return value


def main(argv=None) -> int:
    import argparse

    from harness.nightly.changes import ALPHA, STATISTICAL_HISTORIES

    parser = argparse.ArgumentParser(
        prog="fastpath-suite nightly", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="The nightly speed history: append a night, run the change rule over it (summary and page), "
                    "accept a slowdown, measure the rule's rates.")
    verbs = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = verbs.add_parser("append", help="append one night's run file(s) to a history (created when missing)",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add.add_argument("history", type=Path, help="the history file of one machine and signal, e.g. "
                                                 "history/history-cpu-wall.json")
    add.add_argument("runs", nargs="+", type=Path, help="pytest-benchmark --benchmark-json file(s) or baselines")
    add.add_argument("--label", action="append", default=[],
                     help="a word kept with the night (e.g. busy-core); judge-busy: judge its wall time whatever its "
                          "load says (the load is the runner's normal, not competing work)")
    add.add_argument("--not-judged-limit", type=count_option, default=None, metavar="N",
                     help="set the history's limit on nights in a row not judged (busy) before a night fails for it "
                          f"(kept in the file; a new history gets {NOT_JUDGED_LIMIT})")
    add.add_argument("--new-history", action="store_true",
                     help="start a new history at HISTORY with this night, on purpose (another machine, or a reset): "
                          "the old file is kept beside it as <name>.before-<time>.json. New versions on the same "
                          "machine need no new history: they are recorded, an event on it")
    chk = verbs.add_parser("check", help="the change rule over the histories: exit 1 when a slowdown (or changed "
                                         "mix) is open or the nights not judged in a row pass the history's limit, "
                                         "3 when tonight's wall time is not judged (measured beside competing work)",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    chk.add_argument("history", type=Path, nargs="+",
                     help="history files, one per signal (wall time, instructions, exact counts) of one runner")
    chk.add_argument("--out", type=Path, default=None, help="write summary.md, index.html (the page), alarms.json")
    chk.add_argument("--alpha", type=alpha_option, default=ALPHA,
                     help="false alarms per clean night, the whole suite, in (0, 1]")
    chk.add_argument("--statistical-histories", type=histories_option, default=len(STATISTICAL_HISTORIES),
                     metavar="N", help="how many histories judged with noise the whole suite keeps (the default: "
                                       f"{', '.join(STATISTICAL_HISTORIES)}); each spends alpha / N, whatever "
                                       "number of files this call is given")
    acc = verbs.add_parser("accept", help="accept a slowdown (or a changed mix of exact counts): its new level "
                                          "becomes the reference, and the nights after it are judged against it",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    acc.add_argument("history", type=Path)
    acc.add_argument("point")
    acc.add_argument("--night", required=True, help="the night id the change began (check lists it)")
    acc.add_argument("--reason", required=True)
    verbs.add_parser("rates", help="the rule's operating characteristics on recorded nights (see its --help)",
                     add_help=False)
    verbs.add_parser("bisect", help="from a flagged night to its commit: count a point over a commit range, "
                                    "git-bisect style (see its --help)", add_help=False)
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "rates":
        return rates(argv[1:])
    if argv and argv[0] == "bisect":
        from harness.nightly.bisect import main as bisect_main

        return bisect_main(argv[1:])
    args = parser.parse_args(argv)
    try:
        if args.action == "append":
            history, night = append(args.history, args.runs, args.label, args.not_judged_limit, args.new_history)
            if history.set_aside:
                print(f"{args.history}: a new history starts; the old one is kept as {history.set_aside}")
            print(f"{args.history}: {'added' if night else 'already there:'} night of "
                  f"{', '.join(map(str, args.runs))}" + (f" (id {night.id})" if night else "")
                  + f"; {len(history.nights)} nights of machine {history.machine_key}; at most "
                  f"{history.not_judged_limit} nights in a row not judged")
            for _, changed_night, changed in history.version_changes():
                if night and changed_night.id == night.id:
                    print(f"{args.history}: versions changed on this night: {', '.join(changed)} (an event on the "
                          "history; the rule judges a step at it as any, and names these as its likely cause)")
            return 0
        if args.action == "accept":
            accept(args.history, args.point, args.night, args.reason)
            print(f"{args.history}: the slowdown of {args.point} that began on night {args.night} is accepted")
            return 0
        return check(args)
    except BaselineError as err:  # HistoryError, or a run file baselines.read_run refused
        print(f"error: {err}", file=sys.stderr)
        return 2
