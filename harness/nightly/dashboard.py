"""What the history rule found, for people: the markdown summary a workflow shows, and one static HTML page.

The page is a single file with everything inline (SVG plots, a few lines of script, no server, nothing fetched),
so it opens from a CI artifact: what tonight was judged by (wall time, unless it ran beside competing work;
instruction counts; exact counts), the current alarms, then per signal (one history each) one trend plot per point:
the nightly medians, the level and the night-to-night band (level x exp(+-2 sigma)) the rule judged each night by,
the nights a change began marked with their commits, the nights the versions changed marked with what changed (an
event on the history; a change that began that night names them as its likely cause), nights not judged marked,
and the machine and versions.
"""

from __future__ import annotations

import html
import math

from harness.nightly.changes import ALARM_KINDS, JUDGE_BUSY, STATISTICAL_HISTORIES, PointReport
from harness.nightly.changes import WALL_METRICS as WALL
from harness.nightly.versions import changed_versions

WIDTH, HEIGHT, PAD = 760, 220, 48


def short(commit: str | None) -> str:
    return (commit or "unknown")[:10]


def accept_command(history_path, report: PointReport, event) -> str:
    night = report.nights[event.began]
    return (f"fastpath-suite nightly accept {history_path} {report.point} --night {night.id} "
            "--reason \"...\"")


def began_text(report: PointReport, event) -> str:
    """"night 2026-12-03 (commit abc, after def)": where a change began and the commit range to look in."""
    night = report.nights[event.began]
    before = report.nights[event.began - 1].commit if event.began > 0 else None
    after = f", after {short(before)}" if before and before != night.commit else ""
    return f"{night.date[:10]} (commit {short(night.commit)}{after})"


SIGNALS = {"rtf": "wall time", "seconds": "wall time", "instructions": "instructions", "ops": "exact counts"}


def signal(metric: str) -> str:
    return SIGNALS.get(metric, metric)


def cause_text(event) -> str:
    """"; the versions changed that night: torch 2.14.1 -> 2.15.0 (its likely cause)", or nothing."""
    return (f"; the versions changed that night: {', '.join(event.versions)} (its likely cause)"
            if event.versions else "")


def event_line(report: PointReport, event) -> str:
    return event_text(report, event) + cause_text(event)


def event_text(report: PointReport, event) -> str:
    if event.rule == "exact":
        what = "; ".join(event.detail[:6]) + (f"; and {len(event.detail) - 6} more" if len(event.detail) > 6 else "")
        how = {"slower": "more work", "faster": "less work", "changed": "a changed mix of work (more of some, less "
               "of others)"}[event.kind]
        return f"{how} since {began_text(report, event)}: {what}"
    if event.rule == "accepted":
        return f"{event.change * 100:+.1f}% at {began_text(report, event)}, accepted before any alarm"
    return (f"{abs(event.change) * 100:.1f}% {event.kind} since {began_text(report, event)}, found "
            f"{report.nights[event.alarmed].date[:10]} by the {event.rule} rule (z = {event.z:.1f})")


def version_lines(history) -> list:
    """One line per change of versions on the history: the night, its commit, and what changed."""
    return [f"{night.date[:10]} (night {night.id}, commit {short(night.commit)}): {', '.join(changed)}"
            for _, night, changed in history.version_changes()]


def versions_now(history) -> str:
    """The versions of the history's latest night, "torch 2.15.0, omnivoice 0.2.1, ...", or "not recorded"."""
    versions = history.nights[-1].versions if history.nights else {}
    return ", ".join(f"{k} {v}" for k, v in versions.items()) or "not recorded"


def streak_text(report: PointReport) -> str:
    """"3 nights in a row, the history allows 7": how long tonight's streak of nights not judged is."""
    n = report.not_judged_streak
    allowed = "" if report.not_judged_limit is None else (
        f", over the history's limit of {report.not_judged_limit}" if report.over_limit else
        f", the history allows {report.not_judged_limit}")
    return f"{n} night{'s' if n != 1 else ''} in a row{allowed}"


def judged_by(sections: list) -> str:
    """One line: which signals tonight was judged by, and why wall time was not, if it was not (and for how many
    nights in a row)."""
    judged, not_judged = [], []
    for _, reports in sections:
        for r in reports:
            name = signal(r.metric)
            if r.status == "not judged":
                why = r.not_judged.get(len(r.x) - 1, "")
                not_judged.append(f"{name} ({why}; {streak_text(r)})")
            elif r.status != "missing" and name not in judged:
                judged.append(name)
    judged = [j for j in judged if not any(n.startswith(j + " ") for n in not_judged)]
    line = f"Tonight was judged by: {', '.join(judged) if judged else 'nothing'}."
    if not_judged:
        line += f" Not judged: {', '.join(dict.fromkeys(not_judged))}, measured beside competing work."
    return line


def over_limit_text(history_path, reports: list) -> str:
    """Why a streak of nights not judged fails the night, and what to do."""
    r = max(reports, key=lambda x: x.not_judged_streak)
    since = r.nights[-r.not_judged_streak].date[:10]
    points = (", ".join(x.point for x in reports) if len({x.not_judged_streak for x in reports}) == 1 else
              ", ".join(f"{x.point} ({x.not_judged_streak})" for x in reports))
    return (f"{signal(r.metric)} of {points} not judged for {r.not_judged_streak} nights in a row (since {since}; "
            f"the history allows {r.not_judged_limit}): a slowdown landing in these nights "
            "is not seen. Measure wall time on a quiet machine or at a quiet hour (the speed runner dedicated); if "
            f"this load is the runner's normal and not competing work, append its nights with `--label {JUDGE_BUSY}` "
            "so they are judged; or set another limit knowingly: `fastpath-suite nightly append "
            f"{history_path} RUN --not-judged-limit N`")


def budget_text(reports: list) -> str:
    """The false-alarm budget this history was judged with: its share of the suite's alpha, over its points."""
    rule = next((r.rule for r in reports if r.rule is not None), None)
    if rule is None:
        return "Exact counts: no noise, no false-alarm budget spent."
    return (f"False alarms: alpha {rule.alpha:g} per clean night for the whole suite, {rule.history_alpha:.4g} for "
            f"this history (one of {rule.histories} statistical histories"
            + (f": {', '.join(STATISTICAL_HISTORIES)}" if rule.histories == len(STATISTICAL_HISTORIES) else "")
            + f"), split over its {rule.points} point(s) and the two rules.")


def summary_markdown(history, reports: list) -> str:
    """The workflow's step summary: alarms first, then one row per point, then the changes found before."""
    nights = history.nights
    alarms = [(r, e) for r in reports for e in r.trace.open]
    too_long = [r for r in reports if r.over_limit]
    lines = [f"## Speed history ({signal(reports[0].metric) if reports else 'empty'}): {history.machine_key}", "",
             f"{len(nights)} nights, {nights[0].date[:10]} to {nights[-1].date[:10]}; tonight: commit "
             f"{short(nights[-1].commit)}, versions {versions_now(history)}. Rule: docs/nightly.md. "
             f"{budget_text(reports)}", ""]
    if alarms:
        counts = [f"{n} {what}" for n, what in (
            (sum(e.kind == "slower" for _, e in alarms), "slowdown(s)"),
            (sum(e.kind == "changed" for _, e in alarms), "changed mix(es) of exact counts")) if n]
        lines += [f"### {' and '.join(counts)}: this night fails", ""]
        for r, e in alarms:
            lines += [f"- **{r.point}**: {event_line(r, e)}. Fix it, or accept it: "
                      f"`{accept_command(history.path, r, e)}`"]
        lines.append("")
    else:
        lines += ["### No slowdown open", ""]
    if too_long:
        lines += [f"### Not judged for {max(r.not_judged_streak for r in too_long)} nights in a row: this night fails",
                  "", f"- {over_limit_text(history.path, too_long)}.", ""]
    lines += [judged_by([(history, reports)]), ""]
    lines += ["| point | tonight (median) | level | tonight over the level | night-to-night noise | tonight over "
              "last night | status |", "|---|---|---|---|---|---|---|"]
    for r in reports:
        level, sigma = r.trace.level[-1], r.trace.sigma[-1]
        if r.metric in ("ops",):
            changed = any(e.kind == "changed" for e in r.trace.open)
            status = {"alarm": "**CHANGED MIX**" if changed else "**MORE WORK**"}.get(r.status, r.status)
            prev = f"{math.expm1(r.x[-1] - r.x[-2]) * 100:+.2f}%" if len(r.x) > 1 else "-"
            lines.append(f"| {r.point} | {math.exp(r.x[-1]):,.0f} operator calls | exact | - | 0 | {prev} | {status} |")
            continue
        last = math.exp(r.x[-1])
        d = 1 if r.metric in WALL else 3  # a count's noise is hundredths of a percent
        over = f"{math.expm1(r.x[-1] - level) * 100:+.{d}f}%" if level is not None else "-"
        prev = f"{math.expm1(r.x[-1] - r.x[-2]) * 100:+.{d}f}%" if len(r.x) > 1 else "-"
        noise = f"{sigma * 100:.{d}f}%" if sigma is not None else "-"
        status = {"learning": f"learning ({len(r.x)} nights)", "missing": "NOT MEASURED tonight",
                  "alarm": "**SLOWER**",
                  "not judged": f"{'**NOT JUDGED TOO LONG**: ' if r.over_limit else ''}not judged (busy machine), "
                                f"{streak_text(r)}"}.get(r.status, r.status)
        number = "{:.4g}" if r.metric in WALL else "{:,.0f}"
        lines.append(f"| {r.point} | {number.format(last)} {r.metric} | {number.format(math.exp(level))} | {over} | "
                     f"{noise} | {prev} | {status} |" if level is not None else
                     f"| {r.point} | {number.format(last)} {r.metric} | - | - | - | {prev} | {status} |")
    changes = version_lines(history)
    if changes:
        lines += ["", "### Versions changed", "", "A step on such a night is judged as any, and names them as its "
                  "likely cause.", ""]
        lines += [f"- {line}" for line in changes]
    past = [(r, e) for r in reports for e in r.trace.events if e.status != "open"]
    if past:
        lines += ["", "### Changes found before", ""]
        lines += [f"- {r.point}: {event_line(r, e)}; {e.status}" for r, e in past]
    from harness.nightly.changes import unjudged

    waits = unjudged(history)
    if waits:
        lines += ["", f"Not judged by the history rule: {', '.join(waits)} (waits that may be 0; "
                  "`fastpath-suite compare` judges them against the stored baseline)."]
    missing = [r.point for r in reports if r.status == "missing"]
    if missing:
        lines += ["", f"Not measured tonight: {', '.join(missing)} (no verdict for them; a point the nightly no "
                  "longer runs can stay in the history)."]
    return "\n".join(lines) + "\n"


def plot_svg(report: PointReport) -> str:
    """One trend plot: medians, the band the rule judged by, change nights marked with their commits."""
    n = len(report.x)
    values = [math.exp(v) for v in report.x]
    band = [(i, math.exp(mu - 2 * s), math.exp(mu + 2 * s)) for i, (mu, s) in
            enumerate(zip(report.trace.level, report.trace.sigma)) if mu is not None]
    low = min(values + [b[1] for b in band])
    high = max(values + [b[2] for b in band])
    span = (high - low) or high * 0.05 or 1.0
    low, high = low - 0.08 * span, high + 0.08 * span

    def px(i):
        return PAD + (WIDTH - 2 * PAD) * (i / (n - 1) if n > 1 else 0.5)

    def py(v):
        return HEIGHT - PAD / 2 - (HEIGHT - PAD) * (v - low) / (high - low)

    out = [f'<svg class="trend" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
           f'aria-label="{html.escape(report.point)} over {n} nights">',
           f'<line x1="{PAD}" y1="{HEIGHT - PAD / 2}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD / 2}" class="axis"/>']
    for v in (low + 0.08 * span, high - 0.08 * span):
        out.append(f'<text x="{PAD - 4}" y="{py(v) + 4:.1f}" class="tick" text-anchor="end">{v:.3g}</text>')
    for i in sorted({0, n - 1}):
        out.append(f'<text x="{px(i):.1f}" y="{HEIGHT - 6}" class="tick" text-anchor="middle">'
                   f'{html.escape(report.nights[i].date[:10])}</text>')
    if band:
        top = " ".join(f"{px(i):.1f},{py(h):.1f}" for i, _, h in band)
        bottom = " ".join(f"{px(i):.1f},{py(lo):.1f}" for i, lo, _ in reversed(band))
        out.append(f'<polygon class="band" points="{top} {bottom}"><title>level x exp(+-2 sigma): the '
                   'night-to-night band</title></polygon>')
        out.append('<polyline class="level" points="' + " ".join(
            f"{px(i):.1f},{py(math.exp(mu)):.1f}" for i, mu in enumerate(report.trace.level) if mu is not None)
            + '"/>')
    for i in range(1, n):
        changed = changed_versions(report.nights[i - 1].versions, report.nights[i].versions)
        if changed:
            names = ", ".join(dict.fromkeys(c.split(" ")[0] for c in changed))
            out.append(f'<line class="versions" x1="{px(i):.1f}" y1="{PAD / 2}" x2="{px(i):.1f}" '
                       f'y2="{HEIGHT - PAD / 2}"><title>versions changed: {html.escape(", ".join(changed))}</title>'
                       "</line>")
            out.append(f'<text class="versions-label" x="{px(i) + 3:.1f}" y="{HEIGHT - PAD / 2 - 4}">'
                       f"{html.escape(names)}</text>")
    for e in report.trace.events:
        x = px(e.began)
        commit = short(report.nights[e.began].commit)[:7]
        out.append(f'<line class="change {e.kind}" x1="{x:.1f}" y1="{PAD / 2}" x2="{x:.1f}" '
                   f'y2="{HEIGHT - PAD / 2}"><title>{html.escape(event_line(report, e))}</title></line>')
        out.append(f'<text class="change-label" x="{x + 3:.1f}" y="{PAD / 2 + 10}">{html.escape(commit)}</text>')
    opened = {i for e in report.trace.events if e.kind in ALARM_KINDS
              for i in range(e.began, (e.closed if e.closed is not None else n - 1) + 1)}
    out.append('<polyline class="series" points="' + " ".join(f"{px(i):.1f},{py(v):.1f}"
                                                             for i, v in enumerate(values)) + '"/>')
    for i, (v, night) in enumerate(zip(values, report.nights)):
        cls = "night slow" if i in opened else "night not-judged" if i in report.not_judged else "night"
        samples = night.points[report.point]["samples"]
        out.append(f'<circle class="{cls}" cx="{px(i):.1f}" cy="{py(v):.1f}" r="3"><title>'
                   f'{html.escape(night.date)} commit {html.escape(short(night.commit))}: median {v:.4g} '
                   f'{html.escape(report.metric)} of {len(samples)} samples</title></circle>')
    out.append("</svg>")
    return "\n".join(out)


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em auto; max-width: 800px; color: #222; }
.alarm { background: #fde8e8; border-left: 4px solid #c00; padding: .4em .8em; margin: .4em 0; }
.ok { background: #e8f6ea; border-left: 4px solid #2a7; padding: .4em .8em; }
section.point { border-top: 1px solid #ddd; margin-top: 1em; }
section.point.has-alarm h3 { color: #c00; } h2.signal { margin-top: 1.5em; }
.trend .axis { stroke: #888; } .trend .tick { font-size: 11px; fill: #555; }
.trend .band { fill: #2a7; opacity: .15; } .trend .level { fill: none; stroke: #2a7; stroke-dasharray: 4 3; }
.trend .series { fill: none; stroke: #36c; stroke-width: 1.5; } .trend .night { fill: #36c; }
.trend .night.slow { fill: #c00; } .trend .night.not-judged { fill: #fff; stroke: #999; } .trend .change { stroke: #c00; stroke-dasharray: 3 3; }
.trend .change.faster { stroke: #2a7; } .trend .change.changed { stroke: #d80; }
.trend .change-label { font-size: 11px; fill: #c00; }
.trend .versions { stroke: #85a; stroke-dasharray: 1 3; } .trend .versions-label { font-size: 11px; fill: #85a; }
table { border-collapse: collapse; } td, th { padding: .15em .6em; border-bottom: 1px solid #eee; text-align: left; }
"""

SCRIPT = """
document.getElementById("only-alarms").addEventListener("change", function (event) {
  document.querySelectorAll("section.point").forEach(function (section) {
    section.hidden = event.target.checked && !section.classList.contains("has-alarm");
  });
});
"""


def page_html(sections: list) -> str:
    """The dashboard: one self-contained HTML file over [(history, reports)], one history per signal."""
    esc = html.escape
    latest = max((h.nights[-1] for h, _ in sections), key=lambda n: n.date)
    machine = latest.machine
    versions = latest.versions or machine.get("versions") or {}
    alarms = [(h, r, e) for h, reports in sections for r in reports for e in r.trace.open]
    too_long = [(h, [r for r in reports if r.over_limit]) for h, reports in sections]
    too_long = [(h, rs) for h, rs in too_long if rs]
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           "<title>Speed history</title>", f"<style>{STYLE}</style></head><body>",
           f"<h1>Speed history</h1><p>Tonight: {esc(latest.date[:10])}, commit <code>{esc(short(latest.commit))}</code>. "
           f'<span id="judged-by">{esc(judged_by(sections))}</span></p>', '<div id="alarms">']
    if alarms:
        for h, r, e in alarms:
            out.append(f'<div class="alarm" data-point="{esc(r.point)}"><b>{esc(r.point)}</b> '
                       f"({esc(signal(r.metric))}): {esc(event_line(r, e))}. Accept with "
                       f"<code>{esc(accept_command(h.path, r, e))}</code></div>")
    else:
        out.append('<div class="ok">No slowdown open.</div>')
    for h, reports in too_long:
        out.append(f'<div class="alarm not-judged" data-signal="{esc(signal(reports[0].metric))}">'
                   f"{esc(over_limit_text(h.path, reports))}.</div>")
    out.append("</div>")
    cpu = machine.get("gpu_name") or machine.get("cpu_model") or "?"
    isa = (machine.get("isa") or {}).get("capability")
    out.append("<p>Machine: " + esc(f"{cpu}" + (f" ({isa})" if isa else "")
                                     + f", {machine.get('usable_cpus', '?')} usable CPUs, "
                                     f"{machine.get('torch_threads', '?')} torch threads, {machine.get('platform', '')}")
               + ". Versions: " + esc(", ".join(f"{k} {v}" for k, v in versions.items())) + ".</p>")
    out.append('<p><label><input type="checkbox" id="only-alarms"> only points with a slowdown open or not judged '
               'too long</label></p>')
    for history, reports in sections:
        name = signal(reports[0].metric) if reports else "empty"
        out.append(f'<h2 class="signal">{esc(name)}</h2><p>Machine <code>{esc(history.machine_key)}</code>: '
                   f"{len(history.nights)} nights, {esc(history.nights[0].date[:10])} to "
                   f"{esc(history.nights[-1].date[:10])}. {esc(budget_text(reports))}</p>")
        changes = version_lines(history)
        if changes:
            out.append('<div class="versions-changed"><b>Versions changed</b> (a step on such a night is judged as '
                       "any, and names them as its likely cause):<ul>"
                       + "".join(f"<li>{esc(line)}</li>" for line in changes) + "</ul></div>")
        for r in reports:
            cls = "point has-alarm" if r.trace.open or r.over_limit else "point"
            sigma = r.trace.sigma[-1]
            noise = ("exact counts: any change is named" if r.metric == "ops" else
                     f"night-to-night noise {sigma * 100:.2f}%" if sigma is not None else "learning the noise")
            status = f"not judged, {streak_text(r)}" if r.status == "not judged" else r.status
            out.append(f'<section class="{cls}" data-point="{esc(r.point)}" data-signal="{esc(name)}">'
                       f"<h3>{esc(r.point)}</h3><p>{esc(r.metric)}, median per night; {esc(noise)}; status "
                       f"{esc(status)}.</p>")
            out.append(plot_svg(r))
            if r.trace.events:
                out.append("<ul>" + "".join(f"<li>{esc(event_line(r, e))}: {esc(e.status)}</li>"
                                            for e in r.trace.events) + "</ul>")
            out.append("</section>")
    out.append(f"<script>{SCRIPT}</script></body></html>")
    return "\n".join(out) + "\n"
