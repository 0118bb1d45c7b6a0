"""The history rule: which points got slower, when it began, and how sure the rule is, from many nights at once.

Per (device key, point) the rule follows x = log(median of the night's samples), night by night, as it would have
run on each night (online: night t uses nights <= t only, so re-running it over an old history gives the alarms
that history would have raised):

* **Level and noise** over the *reference*: the in-control nights of the segment since the last accepted change,
  the latest ``WINDOW`` of them. Level mu = their median; noise sigma = their standard deviation (``SCALE`` "sd":
  the reference holds no alarmed night, so it is screened already; "mad", the MAD, is the robust choice and, measured
  on the recorded nights, gave four times the false alarms at its 37% efficiency), never below the within-night error
  of a median (what the night's own samples say) nor ``MIN_SIGMA``: the night-to-night noise, the noise a nightly
  comparison lives with, not the spread of one run's samples.
* **Two rules**, each with an effect-size floor, on z = (x - mu) / sigma:
  - a *step*: one night with z above Student's t quantile at half the point's budget, with the degrees of freedom
    the noise estimate of n nights is worth (n - 1 for the SD, 0.37 (n - 1) for the MAD), and a median at least
    ``STEP_FLOOR`` above the level; z is scaled by the spread of a new night about a median of n nights,
    sigma x sqrt(1 + pi / 2n);
  - a *CUSUM* (Page's one-sided cumulative sum, allowance ``CUSUM_K``) for small persistent steps and drift: it
    alarms when S_t = max(0, S_{t-1} + z_t - k) passes h, h set from Siegmund's approximation of the in-control
    run length so that its false alarms spend the other half of the budget, and the nights since S last left 0 sit
    at least ``DRIFT_FLOOR`` above the level on average.
* **Suite-wide control**: ``alpha`` (default 0.01: one false alarm per 100 clean nights for the whole suite) is
  split evenly over the points (Bonferroni), then over the two rules. The budget is nominal under Gaussian noise;
  `fastpath-suite history rates` measures what it gives on real nights (docs/results.md).
* **When it began**: at an alarm, ruptures' Pelt (l1 cost, ``jump=1``, ``min_size=1``) on the standardised
  segment; the change began at its last breakpoint, penalty ``PELT_PENALTY`` (calibrated by simulation, same page).
* **After an alarm**: a slowdown stays open (and fails the night) until it is fixed (``RECOVER_NIGHTS`` nights in a
  row back within one sigma of the old level) or accepted (``fastpath-suite history accept``: the new level becomes
  the reference from the night it began). A speedup (the mirrored CUSUM, its excursion at least ``STEP_FLOOR`` below
  the level) is noted and fails nothing; its nights stay in the reference, so the level follows it as the window
  fills (taking it as the new level at once made every false speedup a new, short reference: measured, a cascade
  of false alarms).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

ALPHA = 0.01  # false alarms per clean night, the whole suite
MIN_NIGHTS = 5  # reference nights before the rule may alarm ("learning" before)
WINDOW = 30  # the reference: the latest in-control nights of the segment
STEP_FLOOR = 0.05  # a one-night alarm needs a median >= 5% above the level
DRIFT_FLOOR = 0.02  # a cumulative alarm needs its excursion >= 2% above the level on average
CUSUM_K = 0.5  # allowance, in noise units: the CUSUM is tuned to shifts of about one sigma
MIN_SIGMA = 0.002  # the noise is never taken below 0.2% (a point with identical nights)
RECOVER_NIGHTS = 2  # nights in a row back within one sigma of the old level that close a slowdown
SCALE = "sd"
PELT_PENALTY = 4.0  # Pelt's penalty on the standardised series (l1 cost), calibrated by `history rates`


MAD_SCALE = 1.482602218505602  # MAD -> standard deviation of a normal
MAD_EFFICIENCY = 0.37  # of the MAD against the standard deviation, normal data (asymptotic)


@functools.lru_cache(maxsize=None)
def cusum_threshold(arl: float, k: float = CUSUM_K) -> float:
    """h such that a one-sided CUSUM of N(0, 1) has about ``arl`` nights between false alarms (Siegmund):
    ARL0 = (exp(2kb) - 2kb - 1) / (2k^2), b = h + 1.166."""
    def excess(b):
        return (math.exp(2 * k * b) - 2 * k * b - 1) / (2 * k * k) - arl

    return optimize.brentq(excess, 1e-6, 200.0) - 1.166


@functools.lru_cache(maxsize=None)
def step_threshold(budget: float, nights: int, efficiency: float = 1.0) -> float:
    """z above which one night alarms: Student's t at 1 - budget with the degrees of freedom the noise estimate of
    ``nights`` values is worth (the estimator's efficiency against the standard deviation times nights - 1)."""
    return float(stats.t.isf(budget, max(efficiency * (nights - 1), 1.0)))


def predictive(sigma: float, nights: int) -> float:
    """The spread of a new night about a level that is the median of ``nights`` nights: the night's own noise and
    the level's (the variance of a median is pi/2 x sigma^2 / n)."""
    return sigma * math.sqrt(1.0 + math.pi / 2 / nights)


def within_night_sigma(samples, axis: int = -1):
    """Standard error of log(median) of one night's samples (along ``axis``): 1.2533 x (IQR / 1.349) / median /
    sqrt(n); 0 for a single sample. A float for one night, an array for many."""
    samples = np.asarray(samples, dtype=float)
    n = samples.shape[axis]
    q1, med, q3 = np.percentile(samples, [25, 50, 75], axis=axis)
    out = 1.2533 * (q3 - q1) / 1.349 / med / math.sqrt(n) if n > 1 else np.zeros_like(med)
    return float(out) if np.ndim(out) == 0 else out


@dataclass
class Event:
    """A change the rule found on one point. Night positions index the point's own series."""

    kind: str  # "slower" or "faster"
    rule: str  # "step" or "cusum"
    began: int  # first night of the new level (Pelt's last breakpoint)
    alarmed: int  # the night the rule fired
    change: float  # median of the nights began..alarmed over the level, less 1 (0.08: 8% slower)
    z: float  # the alarm night's z
    level: float  # the level before (exp(mu)), in the metric's unit
    status: str = "open"  # "open", "accepted", "recovered" (slower) or "noted" (faster)
    closed: int | None = None  # the night it was accepted or recovered
    detail: list = field(default_factory=list)  # exact counts: what changed, by name ("aten.mm.default: 96 -> 100")


@dataclass
class Trace:
    """The rule's view of one point: per night the level and noise in force (None while learning), and its events."""

    level: list = field(default_factory=list)  # mu per night (log), None while learning
    sigma: list = field(default_factory=list)
    status: list = field(default_factory=list)  # "learning", "ok", "alarm", "open" (a slowdown still open), ...
    events: list = field(default_factory=list)

    @property
    def open(self) -> list:
        return [e for e in self.events if e.kind == "slower" and e.status == "open"]


def check_alpha(alpha) -> float:
    """alpha as a float in (0, 1], else ValueError naming the range (0 disables every alarm, above 1 is not a
    rate, NaN compares false everywhere)."""
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"alpha {alpha!r} is not a number: give false alarms per clean night, in (0, 1]") from None
    if not (0.0 < value <= 1.0):  # NaN fails this too
        raise ValueError(f"alpha {alpha!r} is outside (0, 1]: it is the false alarms per clean night the whole suite "
                         f"may raise (default {ALPHA})")
    return value


@dataclass(frozen=True)
class Rule:
    """The rule's settings; ``points`` is how many points share the suite-wide budget ``alpha``. The floors and the
    noise's floor are the metric's (``METRIC_RULES``)."""

    points: int = 1
    alpha: float = ALPHA
    min_nights: int = MIN_NIGHTS
    window: int = WINDOW
    step_floor: float = STEP_FLOOR
    drift_floor: float = DRIFT_FLOOR
    k: float = CUSUM_K
    penalty: float = PELT_PENALTY
    scale: str = SCALE  # the noise estimate: "sd" (standard deviation) or "mad"
    min_sigma: float = MIN_SIGMA

    def __post_init__(self):
        check_alpha(self.alpha)
        if self.points < 1:
            raise ValueError(f"points {self.points!r}: the budget is split over at least one point")

    @property
    def budget(self) -> float:
        """False alarms per night for one rule on one point."""
        return self.alpha / self.points / 2

    @property
    def h(self) -> float:
        return cusum_threshold(1.0 / self.budget, self.k)


def locate(x: np.ndarray, start: int, end: int, mu: float, sigma: float, penalty: float) -> int | None:
    """The night (index into x) the newest level began, from Pelt over x[start:end + 1] standardised; None when Pelt
    finds no breakpoint."""
    import ruptures

    y = ((x[start:end + 1] - mu) / sigma).reshape(-1, 1)
    if len(y) < 2:
        return None
    breaks = ruptures.Pelt(model="l1", min_size=1, jump=1).fit(y).predict(pen=penalty)[:-1]
    return start + breaks[-1] if breaks else None


def scan(x, within=None, rule: Rule = Rule(), accepted=frozenset(), unjudged=frozenset()) -> Trace:
    """Run the rule over one point's nights.

    Args:
        x: log medians, one per night, in night order.
        within: each night's within-night error of the log median (``within_night_sigma``), or None.
        rule: the settings.
        accepted: night positions a person accepted a change at: there a new segment begins (an open slowdown
            closes as accepted, or the night's own alarm is accepted, or the acceptance is kept as an event), and its
            nights are the reference from then on, whatever night the change is later placed on.
        unjudged: night positions measured beside competing work (harness.speed.conditions): shown, never judged,
            never in the reference.
    """
    x = np.asarray(x, dtype=float)
    within = np.zeros_like(x) if within is None else np.asarray(within, dtype=float)
    xs, ws = x.tolist(), within.tolist()
    use_sd = rule.scale == "sd"
    efficiency = 1.0 if use_sd else MAD_EFFICIENCY
    h = rule.h
    floor_step, floor_drift = math.log1p(rule.step_floor), math.log1p(rule.drift_floor)
    trace = Trace()
    ref: list = []  # positions of the reference nights
    up = down = 0.0  # the CUSUMs
    up_start = down_start = 0
    current: Event | None = None
    held = None  # (mu, sigma, nights) of the level before an open slowdown: what it is judged against until closed
    calm = 0  # nights in a row back near the old level, while a slowdown is open
    for t in range(len(x)):
        if t in unjudged:
            trace.level.append(None), trace.sigma.append(None), trace.status.append("not judged")
            continue
        if current is None and len(ref) < rule.min_nights and t not in accepted:
            ref.append(t)
            trace.level.append(None), trace.sigma.append(None), trace.status.append("learning")
            continue
        if current is not None:
            mu, sigma, n = held
        elif ref:
            recent = ref[-rule.window:]
            window = [xs[r] for r in recent]  # lists, not arrays: statistics.median of <= 30 values is ~10x numpy's
            mu = statistics.median(window)
            spread = 0.0 if len(window) < 2 else (statistics.stdev(window) if use_sd else
                                                   MAD_SCALE * statistics.median([abs(v - mu) for v in window]))
            sigma, n = max(spread, statistics.median([ws[r] for r in recent]), rule.min_sigma), len(window)
        else:  # an accepted night with nothing before it
            mu, sigma, n = xs[t], max(ws[t], rule.min_sigma), 1
        trace.level.append(mu), trace.sigma.append(sigma)
        z = (xs[t] - mu) / predictive(sigma, n)
        if current is not None:  # a slowdown is open: fixed, accepted, or still there
            calm = calm + 1 if z < 1.0 else 0
            if t in accepted:
                current.status, current.closed = "accepted", t
                current, held, ref, up, down = None, None, [t], 0.0, 0.0
                trace.status.append("ok")
            elif calm >= RECOVER_NIGHTS:
                current.status, current.closed = "recovered", t
                current, held, up, down = None, None, 0.0, 0.0
                ref.append(t)
                trace.status.append("ok")
            else:
                trace.status.append("open")
            continue
        if up == 0.0:
            up_start = t
        if down == 0.0:
            down_start = t
        up = max(0.0, up + z - rule.k)
        down = max(0.0, down - z - rule.k)
        limit = step_threshold(rule.budget, n, efficiency)
        excess = xs[t] - mu
        fired = None
        if n >= rule.min_nights and z > limit and excess > floor_step:
            fired = ("slower", "step", t)
        elif n >= rule.min_nights and up > h and statistics.fmean(xs[up_start:t + 1]) - mu > floor_drift:
            fired = ("slower", "cusum", up_start)
        elif n >= rule.min_nights and down > h and mu - statistics.fmean(xs[down_start:t + 1]) > floor_step:
            fired = ("faster", "cusum", down_start)
        if fired is None:
            if t in accepted:  # accepted before (or without) an alarm: kept as an event, the segment restarts
                trace.events.append(Event(kind="slower", rule="accepted", began=t, alarmed=t, z=float(z),
                                          level=math.exp(mu), change=math.expm1(excess), status="accepted", closed=t))
                ref, up, down = [t], 0.0, 0.0
            else:
                ref.append(t)
            trace.status.append("ok")
            continue
        kind, which, fallback = fired
        start = ref[-rule.window:][0] if ref else t
        began = locate(x, start, t, mu, sigma, rule.penalty)
        if began is None or began > t:
            began = fallback
        began = first_changed(xs, began, t, mu, xs[t] if which == "step" else None, kind)
        event = Event(kind=kind, rule=which, began=began, alarmed=t, z=float(z), level=math.exp(mu),
                      change=math.expm1(statistics.median(xs[began:t + 1]) - mu))
        trace.events.append(event)
        if kind == "faster":  # noted, fails nothing; its nights stay in the reference, so the level follows it
            event.status, event.closed = "noted", t
            ref.append(t)
            down = 0.0
            trace.status.append("ok")
            continue
        up = down = 0.0
        if t in accepted:
            event.status, event.closed = "accepted", t
            ref = [t]
            trace.status.append("ok")
        else:
            ref = [r for r in ref if r < began]
            current, held, calm = event, (mu, sigma, n), 0
            trace.status.append("alarm")
    return trace


def first_changed(xs: list, began: int, t: int, mu: float, new: float | None, kind: str) -> int:
    """The first night of the new level: Pelt's breakpoint moved past the nights nearer the old level `mu` than the
    new one (`new`: the alarm night's value for a one-night step, else the median of the nights began..t). Pelt's l1
    cost keeps segments of two nights at least, so a one-night change was placed a night early (or further)."""
    new = statistics.median(xs[began:t + 1]) if new is None else new
    sign = 1.0 if kind == "slower" else -1.0
    half = sign * (new - mu) / 2
    while began < t and sign * (xs[began] - mu) < half:
        began += 1
    return began


@dataclass
class PointReport:
    """The rule's findings on one point of a history, with the nights it ran on."""

    point: str
    metric: str
    nights: list  # the history's nights that measured the point, in order
    x: np.ndarray
    trace: Trace
    tonight: bool  # measured on the history's latest night
    not_judged: dict = field(default_factory=dict)  # position -> why (measured beside competing work)

    @property
    def status(self) -> str:
        """"alarm" (a slowdown open), "learning", "not judged" (tonight measured beside competing work), "faster"
        (a speedup noted tonight), "ok", or "missing" tonight."""
        if self.trace.open:
            return "alarm"
        if not self.tonight:
            return "missing"
        last = self.trace.status[-1]
        if last in ("learning", "not judged"):
            return last
        events = self.trace.events
        if events and events[-1].alarmed == len(self.x) - 1 and events[-1].kind == "faster":
            return "faster"
        return "ok"


# Per metric: the rule's floors and its floor on the noise (a 5% floor makes no sense for a count whose noise is
# 0.01%). Wall time ("rtf", "seconds") keeps the module's defaults; instruction counts (harness.speed.instructions)
# have floors set from what an ordinary change moves a count by (docs/history.md, "Three signals"). Exact
# counts (harness.speed.structure, metric "ops") are not a statistic: `scan_exact` names every change.
METRIC_RULES = {
    "instructions": dict(step_floor=0.01, drift_floor=0.005, min_sigma=0.0005),
}
EXACT_METRICS = ("ops",)
WALL_METRICS = ("rtf", "seconds")
# the exact counters of a point (harness.speed.structure): more of any one is more work
COUNTERS = ("ops", "bytes", "flops", "llm_calls", "llm_positions", "head_rows", "embedded_positions",
            "reference_encodes")


def differences(before: dict, after: dict) -> list:
    """What changed between two nights' counts of one point, exactly: each counter, then each operator."""
    out = [f"{k}: {before.get(k, 0):,} -> {after.get(k, 0):,} ({after.get(k, 0) - before.get(k, 0):+,})"
           for k in COUNTERS if before.get(k) != after.get(k)]
    kinds_a, kinds_b = before.get("by_kind", {}), after.get("by_kind", {})
    for op in sorted(set(kinds_a) | set(kinds_b)):
        a, b = kinds_a.get(op, 0), kinds_b.get(op, 0)
        if a != b:
            out.append(f"{op}: {a:,} -> {b:,} calls ({b - a:+,})")
    return out


def rule_for(metric: str, points: int, alpha: float = ALPHA) -> Rule:
    return Rule(points=points, alpha=alpha, **METRIC_RULES.get(metric, {}))


def exact_counts(night, point: str) -> dict:
    """A night's exact counts of a point: the sample (operator calls) and the counters in its `extra`."""
    entry = night.points[point]
    return {"ops": int(entry["samples"][0]), **{k: v for k, v in (entry.get("extra") or {}).items()}}


def scan_exact(counts: list, accepted=frozenset()) -> Trace:
    """Exact counts night by night (dicts: counter -> number, "by_kind" -> {operator: calls}): the first night is the
    level; a night whose counts differ from it is a change, named exactly (`differences`). More of any counter is a
    slowdown, open until the counts return to the level or it is accepted (that night's counts become the level);
    fewer of some and more of none is noted, and its counts become the level."""
    trace = Trace()
    level = None
    current = None
    for t, now in enumerate(counts):
        trace.level.append(None), trace.sigma.append(None)
        if level is None:
            level = now
            trace.status.append("learning")
            continue
        changed = differences(level, now)
        if current is not None:
            if t in accepted:
                current.status, current.closed, current, level = "accepted", t, None, now
                trace.status.append("ok")
            elif not changed:
                current.status, current.closed, current = "recovered", t, None
                trace.status.append("ok")
            else:
                trace.status.append("open")
            continue
        if not changed:
            trace.status.append("ok")
            continue
        more = any(now.get(k, 0) > level.get(k, 0) for k in COUNTERS)
        event = Event(kind="slower" if more else "faster", rule="exact", began=t, alarmed=t, z=math.inf,
                      level=float(level.get("ops", 0)),
                      change=now["ops"] / level["ops"] - 1 if level.get("ops") else 0.0, detail=changed)
        trace.events.append(event)
        if more and t not in accepted:
            current = event
            trace.status.append("alarm")
        else:
            event.status, event.closed, level = ("accepted" if more else "noted"), t, now
            trace.status.append("ok")
    return trace


def unjudged(history) -> list:
    """Points whose metric is a wait that may be 0 (baselines.NON_NEGATIVE: no log, no ratio); `compare` judges
    those against a baseline."""
    from harness.speed.baselines import NON_NEGATIVE

    return [p for p in history.point_names
            if any(n.points.get(p, {}).get("metric") in NON_NEGATIVE for n in history.nights)]


def busy_nights(nights: list) -> dict:
    """{position: why} of the nights measured beside competing work (harness.speed.conditions.busy)."""
    from harness.speed.conditions import busy

    return {i: why for i, n in enumerate(nights) if (why := busy((n.machine or {}).get("conditions")))}


def check_history(history, alpha: float = ALPHA) -> list:
    """PointReport for every point of a history (but the `unjudged` ones): each with its metric's rule, the budget
    split over the points judged statistically. Wall-time nights measured beside competing work are not judged."""
    alpha = check_alpha(alpha)
    skip = set(unjudged(history))
    names = [p for p in history.point_names if p not in skip]
    metric_of = {name: history.series(name)[0][0].points[name]["metric"] for name in names}
    statistical = [n for n in names if metric_of[n] not in EXACT_METRICS]
    latest = history.nights[-1].id if history.nights else None
    reports = []
    for name in names:
        nights, x = history.series(name)
        metric = metric_of[name]
        position = {n.id: i for i, n in enumerate(nights)}
        accepted = frozenset(position[a["night"]] for a in history.accepted
                             if a["point"] == name and a["night"] in position)
        not_judged = busy_nights(nights) if metric in WALL_METRICS else {}
        if metric in EXACT_METRICS:
            trace = scan_exact([exact_counts(n, name) for n in nights], accepted)
        else:
            within = [within_night_sigma(n.points[name]["samples"]) for n in nights]
            trace = scan(x, within, rule_for(metric, max(len(statistical), 1), alpha), accepted,
                         frozenset(not_judged))
        reports.append(PointReport(point=name, metric=metric, nights=nights, x=x, trace=trace,
                                   tonight=nights[-1].id == latest, not_judged=not_judged))
    return reports
