"""A flagged night reaches a person: one issue on the forge per open change, commented on while it stays open, closed
when it is fixed or accepted.

    fastpath-suite nightly alert out/history/alarms.json HISTORY [HISTORY ...] [--page URL] [--gh gh] [--dry-run]

It reads the check's verdict (`nightly check --out DIR` writes DIR/alarms.json: each open change, and each streak of
nights not judged past its limit) and the histories that check judged, asks the forge for its open issues labelled
``nightly-alert`` (`gh issue list`), and for each open change:

* no open issue has its key: `nightly bisect` over the commits since the last good night (the night before the change
  began to the night it began; a count history only: exact counts and instructions), then `gh issue create` with the
  signal, the point, the nights, the range, the commit bisect found and a link to the page;
* an open issue has its key: `gh issue comment` with tonight's figure (the change files once, not every night).

An open issue whose history was judged tonight and whose change is no longer open is closed (`gh issue close`) with
the reason: accepted (the history's `accepted` entry and its reason), or fixed (the night the rule found the point
back at its old level). A change's key is its history's file name, its point, its kind and the night it began; it is
written into the issue's body, so it survives the issue's title being edited. Issues of histories not given (another
runner's) are left alone.

The forge is GitHub, through its own command-line client (`gh`: GH_TOKEN and GH_REPO from the environment); `--gh`
(or FASTPATH_GH) names another executable with gh's arguments, such as the stand-in the tests use. Exit 0 when every
change was filed or commented on and every closed one closed; 2 on bad input or when any forge call failed (each is
named, with the client's own message): an alert that did not reach the forge is never a quiet pass.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness import REPO_ROOT
from harness.speed.baselines import BaselineError

LABEL = "nightly-alert"
MARKER = re.compile(r"<!-- nightly-alert-key: (.+?) -->")
GH_TIMEOUT = 300
TABLE_ROWS = 8  # nights shown in an issue: the last good one, the first of the change, then the latest ones


class AlertError(ValueError):
    pass


# --- the decision -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One open alarm of alarms.json."""

    history: str  # the history's path as the check was given it
    point: str
    metric: str
    kind: str  # "slower", "changed" (exact counts), or "not judged" (a streak past the history's limit)
    began: str  # the id of the night the change (or the streak) began
    raw: dict

    @property
    def key(self) -> str:
        return "|".join((Path(self.history).name, self.point, self.kind, self.began))


@dataclass(frozen=True)
class Issue:
    number: int
    title: str
    key: str | None  # None: not one this command filed (no key in its body)

    @property
    def history(self) -> str | None:
        return self.key.split("|")[0] if self.key else None


def plan(changes: list, issues: list, judged: set) -> list:
    """What to do on the forge: ("create", change, None) for an open change without an open issue, ("comment", change,
    issue) for one with, ("close", None, issue) for an open issue whose history (a file name in ``judged``) was judged
    tonight and whose change is no longer open. Issues without a key, or of a history not judged tonight, are left."""
    by_key = {i.key: i for i in issues if i.key}
    actions = [("comment", c, by_key[c.key]) if c.key in by_key else ("create", c, None) for c in changes]
    open_keys = {c.key for c in changes}
    actions += [("close", None, i) for i in issues if i.key and i.history in judged and i.key not in open_keys]
    return actions


# --- reading the check's verdict ----------------------------------------------------------------------------


def read_alarms(path: Path) -> list:
    fix = "write it with `fastpath-suite nightly check HISTORY ... --out DIR` (DIR/alarms.json)"
    if not path.is_file():
        raise AlertError(f"no {path}: the check did not write its verdict (it broke, or ran without --out); {fix}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise AlertError(f"{path} is not readable JSON ({err}); {fix}") from None
    need = ("history", "point", "kind", "began")
    if not isinstance(data, list) or any(not isinstance(a, dict) or any(k not in a for k in need) for a in data):
        raise AlertError(f"{path} is not the check's list of alarms (each with {', '.join(need)}); {fix}")
    return [Change(str(a["history"]), str(a["point"]), str(a.get("metric", "")), str(a["kind"]), str(a["began"]), a)
            for a in data]


# --- the texts ------------------------------------------------------------------------------------------------


def figure(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if metric in ("ops", "instructions") else f"{value:.4g}"


def short(commit: str | None) -> str:
    return (commit or "unknown")[:12]


@dataclass
class Nights:
    """The nights of one point around a change: the last good one (before it began), the first of it, tonight."""

    series: list  # the point's nights, in order
    began: int | None  # position of the change's first night in `series` (None: not in the history)
    latest: str | None  # the history's latest night id

    @property
    def last_good(self):
        return self.series[self.began - 1] if self.began else None

    @property
    def tonight(self):
        return self.series[-1] if self.series and self.series[-1].id == self.latest else None


def nights_of(history, change: Change) -> Nights:
    series = [n for n in history.nights if change.point in n.points]
    began = next((i for i, n in enumerate(series) if n.id == change.began), None)
    return Nights(series, began, history.nights[-1].id if history.nights else None)


def against(night, base, point: str) -> str:
    if night is None or base is None or not base.median(point):
        return "-"
    return f"{night.median(point) / base.median(point) - 1:+.2%}"


def nights_table(nights: Nights, change: Change) -> list:
    """Markdown rows: the last good night, the change's first night, and the latest nights up to tonight."""
    point, base = change.point, nights.last_good
    start = nights.began - 1 if nights.began else 0
    rows = list(range(start, len(nights.series)))
    if len(rows) > TABLE_ROWS:
        rows = rows[:2] + rows[-(TABLE_ROWS - 2):]
    lines = ["| night | date | commit | median | against the last good night |", "|---|---|---|---|---|"]
    for i, pos in enumerate(rows):
        n = nights.series[pos]
        what = ("last good" if n is base else "began" if pos == nights.began else
                "tonight" if n is nights.tonight else "")
        if i and pos != rows[i - 1] + 1:
            lines.append(f"| ... {pos - rows[i - 1] - 1} nights | | | | |")
        lines.append(f"| `{n.id}` {what} | {n.date[:10]} | `{short(n.commit)}` | "
                     f"{figure(n.median(point), change.metric)} | {against(n, base, point)} |")
    return lines


def title(change: Change) -> str:
    from harness.nightly.dashboard import signal

    where = f"({signal(change.metric)}, {Path(change.history).stem})"
    date = str(change.raw.get("began_date", ""))[:10]
    if change.kind == "not judged":
        return (f"nightly: {change.point} not judged {change.raw.get('streak')} nights in a row, past the limit of "
                f"{change.raw.get('limit')} {where}")
    if change.kind == "changed":
        return f"nightly: {change.point} {kind_text(change)} since {date} {where}"
    amount = change.raw.get("change")
    by = f" by {amount:+.1%}" if isinstance(amount, (int, float)) else ""
    return f"nightly: {change.point} {kind_text(change)}{by} since {date} {where}"


def kind_text(change: Change) -> str:
    """What the change is, in the signal's words: a count that rose is more work, a time that rose is slower."""
    if change.kind == "changed":
        return "changed mix of work"
    return "more work" if change.kind == "slower" and change.metric in ("ops", "instructions") else change.kind


def links(page: str | None, run: str | None) -> str:
    page_text = f"[the page]({page}) (`out/history/index.html` in the artifact)" if page else \
        "the page: not linked (no --page given)"
    return page_text + (f"; [the run]({run})" if run else "")


def body(change: Change, nights: Nights, found: list, page: str | None, run: str | None) -> str:
    from harness.nightly.dashboard import signal

    raw = change.raw
    if change.kind == "not judged":
        what = (f"**{change.point}** in `{change.history}` (signal: {signal(change.metric)}) was not judged for "
                f"{raw.get('streak')} nights in a row (measured beside competing work: {', '.join(raw.get('detail') or [])}), "
                f"past the history's limit of {raw.get('limit')}, from the night `{change.began}` on.")
    else:
        amount = raw.get("change")
        by = f" by {amount:+.2%}" if isinstance(amount, (int, float)) else ""
        what = (f"**{change.point}** in `{change.history}` (signal: {signal(change.metric)}): {kind_text(change)}{by}, "
                f"found by the {raw.get('rule')} rule, open since the night `{change.began}` "
                f"({str(raw.get('began_date', ''))[:10]}, commit `{short(raw.get('commit'))}`).")
    lines = [what, "", *nights_table(nights, change), ""]
    if raw.get("detail") and change.kind != "not judged":
        lines += ["What moved:", "", *[f"- {d}" for d in raw["detail"][:20]], ""]
    lines += [*found, "", f"Links: {links(page, run)}.", ""]
    if change.kind == "not judged":
        lines.append("It closes when the wall time is judged again (a quiet night, or the limit raised: "
                     "docs/nightly.md, 'Wall time not judged too long').")
    else:
        lines.append(f"Fix it (the rule closes it once the point is back at its old level), or accept it: "
                     f"`fastpath-suite nightly accept {change.history} {change.point} --night {change.began} "
                     f"--reason \"...\"`. Either closes this issue on the next night.")
    lines += ["", "Filed by `fastpath-suite nightly alert` (docs/nightly.md, 'When a night is flagged'): later "
              "flagged nights of this change comment here.", f"<!-- nightly-alert-key: {change.key} -->"]
    return "\n".join(lines) + "\n"


def still_open(change: Change, nights: Nights, page: str | None, run: str | None) -> str:
    n = nights.tonight
    if change.kind == "not judged":
        head = f"Still not judged: {change.raw.get('streak')} nights in a row (limit {change.raw.get('limit')})."
    elif n is None:
        head = f"Still open; {change.point} was not measured on the latest night."
    else:
        head = (f"Still open on the night `{n.id}` ({n.date[:10]}, commit `{short(n.commit)}`): "
                f"{figure(n.median(change.point), change.metric)}, {against(n, nights.last_good, change.point)} "
                "against the last good night.")
    return f"{head}\n\nLinks: {links(page, run)}.\n"


# --- the range and its bisection ------------------------------------------------------------------------------


def bisection(change: Change, nights: Nights, repo: Path, counter, log, search: bool = True) -> list:
    """Markdown lines: the range since the last good night and what `nightly bisect` found in it (or why it did not
    run: a wall-time point is no counting point, the nights give no range, the search itself broke)."""
    from harness.nightly import bisect
    from harness.nightly.history import BISECT_SIGNALS

    if change.kind == "not judged":
        return ["Range: none (no change of the code is named: the measurement was not judged)."]
    before, first = nights.last_good, (nights.series[nights.began] if nights.began is not None else None)
    if before is None or first is None or not before.commit or not first.commit:
        return [f"Range: none: the nights give no range of commits (the change began on the night `{change.began}`, "
                "the first of the point's nights, or a night records no commit). Not bisected."]
    good, bad = before.commit.removesuffix("-dirty"), first.commit.removesuffix("-dirty")
    dirty = " (a night ran with uncommitted changes: its commit is approximate)" if "-dirty" in before.commit + \
        first.commit else ""
    lines = [f"Range: `{good[:12]}..{bad[:12]}`, the last good night's commit to the first flagged night's{dirty} "
             f"(`git log --first-parent {good[:12]}..{bad[:12]}`)."]
    if good == bad:
        return lines + ["", "Both nights ran the same commit: the change is not in the code (the machine, the packages?). "
                        "Not bisected."]
    signal = BISECT_SIGNALS.get(change.metric)
    point, _, variant = change.point.partition("/")
    if signal is None:
        return lines + ["", f"Not bisected: {change.point} is a wall-time point, not a counting point; count its work "
                        f"over the range with `{bisect.command_for(good, bad, 'POINT', 'instructions')}` "
                        "(POINT: a counting point, fixtures/points.json 'counts')."]
    command = bisect.command_for(good, bad, point, signal) + (f" --variant {variant}" if variant else "")
    if not search:
        return lines + ["", f"Not bisected (a dry run): `{command}`."]
    try:
        result = bisect.bisect(repo, good, bad, point, signal, variant or "lossless", log=log,
                               counter=counter or bisect.count_at)
    except bisect.BisectError as err:
        return lines + ["", f"Bisect (`{command}`) could not search the range: {err}"]
    if not result.steps:
        found = (f"Bisect found no step: the two ends count {result.good.count:,} and {result.bad.count:,}, within the "
                 "floor (the night's change is not in these commits' counts).")
    else:
        found = "Bisect found: " + "; ".join(
            (f"`{s.after.commit}` {s.after.subject} ({s.before.count:,} -> {s.after.count:,}, {s.change:+.3%})"
             if s.named else f"no one commit between `{short(s.before.commit)}` and `{short(s.after.commit)}` "
             f"({'a drift' if s.drift else 'among skipped commits'}, {s.change:+.3%})") for s in result.steps) + "."
    return lines + ["", found, "", f"`{command}`:", "", "```text", bisect.format_result(result, good[:12], bad[:12]),
                    "```"]


# --- closing ----------------------------------------------------------------------------------------------------


def closing(issue: Issue, history, run: str | None) -> tuple | None:
    """(gh's close reason, the comment) for an open issue whose change is no longer open; None when the history no
    longer holds the night its change began (reset or rewritten): then it cannot say, and the issue is left open."""
    from harness.nightly.changes import check_history

    _, point, kind, began = issue.key.split("|")
    suffix = f"\n\nClosed by `fastpath-suite nightly alert`{f' ([the run]({run}))' if run else ''}.\n"
    if kind == "not judged":
        return "completed", ("No longer past the limit of nights not judged: tonight's wall time was judged (or the "
                             "limit raised)." + suffix)
    accepted = next((a for a in history.accepted if a["point"] == point and a["night"] == began), None)
    if accepted:
        return "not planned", (f"Accepted on {str(accepted.get('date', ''))[:10]}: {accepted.get('reason', '')}. The "
                               "nights after it are judged against the new level." + suffix)
    if not any(n.id == began for n in history.nights):
        return None
    report = next((r for r in check_history(history) if r.point == point), None)
    event = next((e for e in (report.trace.events if report else []) if report.nights[e.began].id == began), None)
    if event is not None and event.status == "recovered":
        n = report.nights[event.closed]
        return "completed", (f"Fixed: the rule found {point} back at its old level "
                             f"({figure(n.median(point), report.metric)}) on the night `{n.id}` ({n.date[:10]}, "
                             f"commit `{short(n.commit)}`)." + suffix)
    return "completed", ("Fixed: tonight's check no longer holds this change open, and no one accepted it." + suffix)


# --- the forge --------------------------------------------------------------------------------------------------


class Forge:
    """GitHub through its command-line client (`gh`); a dry run prints the calls instead."""

    def __init__(self, gh: str, dry_run: bool = False):
        self.gh, self.dry_run = gh, dry_run

    def call(self, args: list, stdin: str | None = None) -> str:
        command = [self.gh, *args]
        if self.dry_run:
            print(f"would run: {shlex.join(command)}" + ("  <<<\n" + stdin if stdin else ""))
            return ""
        try:
            done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=GH_TIMEOUT)
        except FileNotFoundError:
            raise AlertError(f"{self.gh!r} not found: install GitHub's command-line client (Debian: apt-get install "
                             "gh) or name it with --gh (FASTPATH_GH)") from None
        except subprocess.TimeoutExpired:
            raise AlertError(f"`{shlex.join(command)}` did not answer in {GH_TIMEOUT} s") from None
        if done.returncode != 0:
            said = (done.stderr.strip() or done.stdout.strip() or "no message")[-2000:]
            raise AlertError(f"`{shlex.join(command[:3])} ...` failed (exit {done.returncode}): {said}")
        return done.stdout

    def open_issues(self, label: str) -> list:
        if self.dry_run:
            print("dry run: the forge's open issues not asked; every change is shown as a new issue")
            return []
        text = self.call(["issue", "list", "--label", label, "--state", "open", "--limit", "1000",
                          "--json", "number,title,body"])
        try:
            found = json.loads(text or "[]")
            return [Issue(int(i["number"]), str(i.get("title", "")),
                          m.group(1) if (m := MARKER.search(str(i.get("body") or ""))) else None) for i in found]
        except (ValueError, TypeError, KeyError) as err:
            raise AlertError(f"`{self.gh} issue list` did not answer a JSON list of issues ({err}): {text[:500]}")

    def create(self, title: str, text: str, label: str) -> str:
        self.call(["label", "create", label, "--color", "B60205", "--force",
                   "--description", "A change the nightly speed history found (fastpath-suite nightly alert)"])
        return self.call(["issue", "create", "--title", title, "--label", label, "--body-file", "-"], text).strip()

    def comment(self, number: int, text: str) -> None:
        self.call(["issue", "comment", str(number), "--body-file", "-"], text)

    def close(self, number: int, reason: str, text: str) -> None:
        self.call(["issue", "close", str(number), "--reason", reason, "--comment", text])


# --- the run ------------------------------------------------------------------------------------------------------


def run_url() -> str | None:
    parts = [os.environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID")]
    return f"{parts[0]}/{parts[1]}/actions/runs/{parts[2]}" if all(parts) else None


def alert(alarms: Path, histories: list, forge: Forge, label: str = LABEL, page: str | None = None,
          run: str | None = None, repo: Path = REPO_ROOT, counter=None, log=print, search: bool = True) -> list:
    """Tell the forge what tonight's check found (module docstring). Returns the failures, each a sentence; raises
    AlertError on bad input, before any call to the forge."""
    from harness.nightly.history import load_history

    changes = read_alarms(alarms)
    loaded = {Path(p).name: load_history(p) for p in histories}
    stray = sorted({Path(c.history).name for c in changes} - set(loaded))
    if stray:
        raise AlertError(f"{alarms} has alarms of {stray}, which are not among the histories given "
                         f"({sorted(loaded)}): give every history the check judged")
    failures = []
    try:
        issues = forge.open_issues(label)
    except AlertError as err:
        return [str(err)]
    for action, change, issue in plan(changes, issues, set(loaded)):
        try:
            if action == "close":
                reason = closing(issue, loaded[issue.history], run)
                if reason is None:
                    log(f"::warning::issue #{issue.number} ({issue.key}): the night its change began is no longer in "
                        f"{issue.history}; left open (close it by hand)")
                    continue
                forge.close(issue.number, *reason)
                log(f"closed #{issue.number} ({reason[0]}): {issue.title}")
                continue
            nights = nights_of(loaded[Path(change.history).name], change)
            if action == "comment":
                forge.comment(issue.number, still_open(change, nights, page, run))
                log(f"commented on #{issue.number}: {issue.title}")
            else:
                found = bisection(change, nights, repo, counter, lambda msg: print(msg, file=sys.stderr, flush=True),
                                  search)
                url = forge.create(title(change), body(change, nights, found, page, run), label)
                log(f"filed {url or 'an issue (a dry run)'}: {title(change)}")
        except AlertError as err:
            failures.append(str(err))
    return failures


def main(argv=None, counter=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="fastpath-suite nightly alert", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("alarms", type=Path, help="the check's verdict: DIR/alarms.json of `nightly check --out DIR`")
    parser.add_argument("history", type=Path, nargs="+", help="every history that check judged (an open issue of "
                                                              "one of them whose change is no longer open is closed)")
    parser.add_argument("--page", default=None, help="the link to the page (the artifact holding out/history/)")
    parser.add_argument("--run-url", default=None, help="the link to this run; None: from the GITHUB_* variables")
    parser.add_argument("--label", default=LABEL, help="the label of the issues this command files and reads")
    parser.add_argument("--gh", default=None,
                        help="the forge's client: gh, or an executable taking gh's arguments; None: $FASTPATH_GH, "
                             "else gh")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the git checkout whose commits are bisected")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the calls to the forge instead of making them (no bisect: its command is shown)")
    args = parser.parse_args(argv)
    gh = args.gh or os.environ.get("FASTPATH_GH", "gh")  # read here: the help is the same on every machine
    try:
        failures = alert(args.alarms, args.history, Forge(gh, args.dry_run), args.label, args.page,
                         args.run_url or run_url(), args.repo, counter, search=not args.dry_run)
    except (AlertError, BaselineError) as err:  # HistoryError: a history missing, corrupt or foreign
        print(f"error: {err}", file=sys.stderr)
        return 2
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    if failures:
        print(f"error: {len(failures)} call(s) to the forge failed: the alert did not reach it whole", file=sys.stderr)
        return 2
    return 0

