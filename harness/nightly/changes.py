"""The history rule: which points got slower, when it began, and how sure the rule is, from many nights at once.

Per (history, point) (a history: one machine and one signal) the rule follows x = log(median of the night's
samples), night by night, as it would have run on each night (online: night t uses nights <= t only, so re-running
it over an old history gives the alarms that history would have raised):

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
  split evenly over the statistical histories the suite keeps (``STATISTICAL_HISTORIES``: CPU wall time, CPU
  instructions, GPU wall time; the exact counts have no noise and spend none), then over each history's points
  (Bonferroni), then over the two rules. Each history's share is fixed by that declaration, not by how many files
  one `nightly check` is given (each runner checks its own). The budget is nominal under Gaussian noise;
  `fastpath-suite nightly rates` measures what it gives on real nights (docs/results.md).
* **When it began**: at an alarm, ruptures' Pelt (l1 cost, ``jump=1``, ``min_size=1``) on the standardised
  segment; the change began at its last breakpoint, penalty ``PELT_PENALTY`` (calibrated by simulation, same page).
* **After an alarm**: a slowdown stays open (and fails the night) until it is fixed (``RECOVER_NIGHTS`` nights in a
  row back within one sigma of the old level) or accepted (``fastpath-suite nightly accept``: the new level becomes
  the reference from the night it began). A speedup (the mirrored CUSUM, its excursion at least ``STEP_FLOOR`` below
  the level) is noted and fails nothing; its nights stay in the reference, so the level follows it as the window
  fills (taking it as the new level at once made every false speedup a new, short reference: measured, a cascade
  of false alarms).
* **A change of versions** (torch, omnivoice, any recorded package: the history's nights record theirs) is judged
  as any night: a step on the night the versions changed alarms as it would on any night, no more and no less, and
  the event names the versions that changed that night as its likely cause (``name_causes``).
* **After an accepted change** the nights are judged at once against the accepted level: the median of the new
  segment's nights, with the noise (and its degrees of freedom) carried from the reference before the change until
  the segment has ``MIN_NIGHTS`` nights of its own. While the noise is carried only the one-night step judges (its
  z is scaled by the spread of a new night about a median of the few new nights); the CUSUMs start with the
  segment's own noise (a level from one or two nights shifts every later z alike, which a cumulative sum adds up).
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, stats

ALPHA = 0.01  # false alarms per clean night, the whole suite
# The histories the suite judges statistically (.github/workflows/nightly.yml: the CPU runner's wall time and
# instructions, the GPU runner's wall time): each spends ALPHA / len(STATISTICAL_HISTORIES). The exact counts spend
# none (no noise: any change is named). A suite that keeps more says so: `nightly check --statistical-histories N`.
STATISTICAL_HISTORIES = ("CPU wall time", "CPU instructions", "GPU wall time")
MIN_NIGHTS = 5  # reference nights before the rule may alarm ("learning" before)
WINDOW = 30  # the reference: the latest in-control nights of the segment
STEP_FLOOR = 0.05  # a one-night alarm needs a median >= 5% above the level
DRIFT_FLOOR = 0.02  # a cumulative alarm needs its excursion >= 2% above the level on average
CUSUM_K = 0.5  # allowance, in noise units: the CUSUM is tuned to shifts of about one sigma
MIN_SIGMA = 0.002  # the noise is never taken below 0.2% (a point with identical nights)
RECOVER_NIGHTS = 2  # nights in a row back within one sigma of the old level that close a slowdown
SCALE = "sd"
PELT_PENALTY = 4.0  # Pelt's penalty on the standardised series (l1 cost), calibrated by `nightly rates`


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

    kind: str  # "slower", "faster", or "changed" (exact counts: more of some kind and fewer of another)
    rule: str  # "step" or "cusum"
    began: int  # first night of the new level (Pelt's last breakpoint)
    alarmed: int  # the night the rule fired
    change: float  # median of the nights began..alarmed over the level, less 1 (0.08: 8% slower)
    z: float  # the alarm night's z
    level: float  # the level before (exp(mu)), in the metric's unit
    status: str = "open"  # "open", "accepted", "recovered" (slower) or "noted" (faster)
    closed: int | None = None  # the night it was accepted or recovered
    detail: list = field(default_factory=list)  # exact counts: what changed, by name ("aten.mm.default: 96 -> 100")
    versions: list = field(default_factory=list)  # the versions that changed on the night it began: its likely cause


@dataclass
class Trace:
    """The rule's view of one point: per night the level and noise in force (None while learning), and its events."""

    level: list = field(default_factory=list)  # mu per night (log), None while learning
    sigma: list = field(default_factory=list)
    status: list = field(default_factory=list)  # "learning", "ok", "alarm", "open" (a slowdown still open), ...
    events: list = field(default_factory=list)

    @property
    def open(self) -> list:
        return [e for e in self.events if e.kind in ALARM_KINDS and e.status == "open"]


# the kinds of change that fail the night until fixed or accepted: more work, and a changed mix of operators (more
# of one kind for fewer of another is not a speedup: an exp costs more than an add)
ALARM_KINDS = ("slower", "changed")


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
    """The rule's settings for one point of one history: the suite-wide budget ``alpha`` is split over
    ``histories`` statistical histories, then over the history's ``points``, then over the two rules. The floors and
    the noise's floor are the metric's (``METRIC_RULES``)."""

    points: int = 1
    alpha: float = ALPHA
    histories: int = len(STATISTICAL_HISTORIES)
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
        if self.histories < 1:
            raise ValueError(f"histories {self.histories!r}: the budget is split over at least one history")

    @property
    def history_alpha(self) -> float:
        """False alarms per clean night for this point's history: its share of the suite's alpha."""
        return self.alpha / self.histories

    @property
    def budget(self) -> float:
        """False alarms per night for one rule on one point."""
        return self.history_alpha / self.points / 2

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
            nights are the reference from then on, whatever night the change is later placed on. A dict maps each to
            the last night the person had seen when accepting (a set: the accepted night itself): the nights up to
            it are part of what was accepted (in the reference, not judged); the nights after it are judged at once
            against the new segment's level, with the noise carried from before the change until the segment has
            ``min_nights`` nights of its own.
        unjudged: night positions measured beside competing work (harness.speed.conditions): shown, never judged,
            never in the reference.
    """
    x = np.asarray(x, dtype=float)
    within = np.zeros_like(x) if within is None else np.asarray(within, dtype=float)
    xs, ws = x.tolist(), within.tolist()
    accepted = dict(accepted) if isinstance(accepted, dict) else {a: a for a in accepted}  # night -> seen through
    use_sd = rule.scale == "sd"
    efficiency = 1.0 if use_sd else MAD_EFFICIENCY
    h = rule.h
    floor_step, floor_drift = math.log1p(rule.step_floor), math.log1p(rule.drift_floor)
    trace = Trace()
    ref: list = []  # positions of the reference nights
    up = down = 0.0  # the CUSUMs
    up_start = down_start = 0
    current: Event | None = None
    held = None  # (mu, sigma, n_level, n_noise) before an open slowdown: what it is judged against until closed
    carried = None  # (sigma, n_noise): the noise before an accepted change, until its segment has min_nights nights
    seen = -1  # the last night of an accepted change that the person had seen when accepting it
    calm = 0  # nights in a row back near the old level, while a slowdown is open

    def restart(sigma: float, n_noise: int):
        """A new segment at an accepted night: its noise is carried when it was learned (min_nights or more)."""
        return (sigma, n_noise) if n_noise >= rule.min_nights else None

    for t in range(len(x)):
        if t in unjudged:
            trace.level.append(None), trace.sigma.append(None), trace.status.append("not judged")
            continue
        if carried is not None and len(ref) >= rule.min_nights:
            carried = None  # the segment has noise of its own now
        if current is None and carried is None and len(ref) < rule.min_nights and t not in accepted:
            ref.append(t)
            trace.level.append(None), trace.sigma.append(None), trace.status.append("learning")
            continue
        if current is not None:
            mu, sigma, n_level, n_noise = held
        elif ref:
            recent = ref[-rule.window:]
            window = [xs[r] for r in recent]  # lists, not arrays: statistics.median of <= 30 values is ~10x numpy's
            mu = statistics.median(window)
            error = statistics.median([ws[r] for r in recent])
            if carried is not None:  # the accepted level, judged with the noise from before the change
                sigma, n_noise = max(carried[0], error, rule.min_sigma), carried[1]
            else:
                spread = 0.0 if len(window) < 2 else (statistics.stdev(window) if use_sd else
                                                       MAD_SCALE * statistics.median([abs(v - mu) for v in window]))
                sigma, n_noise = max(spread, error, rule.min_sigma), len(window)
            n_level = len(window)
        else:  # an accepted night with nothing before it
            mu, sigma, n_level, n_noise = xs[t], max(ws[t], rule.min_sigma), 1, 1
        trace.level.append(mu), trace.sigma.append(sigma)
        z = (xs[t] - mu) / predictive(sigma, n_level)
        if t <= seen and t not in accepted:  # seen and accepted with the change: the new level, not judged
            ref.append(t)
            trace.status.append("ok")
            continue
        if current is not None:  # a slowdown is open: fixed, accepted, or still there
            calm = calm + 1 if z < 1.0 else 0
            if t in accepted:
                current.status, current.closed = "accepted", t
                current, held, ref, up, down = None, None, [t], 0.0, 0.0
                carried, seen = restart(sigma, n_noise), accepted[t]
                trace.status.append("ok")
            elif calm >= RECOVER_NIGHTS:
                current.status, current.closed = "recovered", t
                current, held, up, down = None, None, 0.0, 0.0
                ref.append(t)
                trace.status.append("ok")
            else:
                trace.status.append("open")
            continue
        judged = n_noise >= rule.min_nights
        cumulative = judged and carried is None  # the CUSUMs wait for the segment's own noise
        if cumulative:
            if up == 0.0:
                up_start = t
            if down == 0.0:
                down_start = t
            up = max(0.0, up + z - rule.k)
            down = max(0.0, down - z - rule.k)
        limit = step_threshold(rule.budget, n_noise, efficiency)
        excess = xs[t] - mu
        fired = None
        if judged and z > limit and excess > floor_step:
            fired = ("slower", "step", t)
        elif cumulative and up > h and statistics.fmean(xs[up_start:t + 1]) - mu > floor_drift:
            fired = ("slower", "cusum", up_start)
        elif cumulative and down > h and mu - statistics.fmean(xs[down_start:t + 1]) > floor_step:
            fired = ("faster", "cusum", down_start)
        if fired is None:
            if t in accepted:  # accepted before (or without) an alarm: kept as an event, the segment restarts
                trace.events.append(Event(kind="slower", rule="accepted", began=t, alarmed=t, z=float(z),
                                          level=math.exp(mu), change=math.expm1(excess), status="accepted", closed=t))
                ref, up, down = [t], 0.0, 0.0
                carried, seen = restart(sigma, n_noise), accepted[t]
            else:
                ref.append(t)
            trace.status.append("ok")
            continue
        kind, which, fallback = fired
        if t in accepted:  # the person placed this change: it began tonight
            began = t
        else:
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
            carried, seen = restart(sigma, n_noise), accepted[t]
            trace.status.append("ok")
        else:
            ref = [r for r in ref if r < began]
            current, held, calm = event, (mu, sigma, n_level, n_noise), 0
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
    rule: Rule | None = None  # the statistical rule it was judged by (None: exact counts)
    not_judged_limit: int | None = None  # the history's limit on nights in a row not judged (None: no limit)

    @property
    def not_judged_streak(self) -> int:
        """Nights in a row not judged, ending tonight (0 when tonight was judged or the point not measured)."""
        if not self.tonight:
            return 0
        streak = 0
        for status in reversed(self.trace.status):
            if status != "not judged":
                break
            streak += 1
        return streak

    @property
    def over_limit(self) -> bool:
        """Tonight ends a streak of nights not judged longer than the history allows: the night fails (a slowdown
        landing in such a stretch would go unjudged for as long as it lasts)."""
        return self.not_judged_limit is not None and self.not_judged_streak > self.not_judged_limit

    @property
    def status(self) -> str:
        """"alarm" (a slowdown or changed mix open), "learning", "not judged" (tonight measured beside competing
        work; `over_limit` says whether the streak fails the night), "faster" (a speedup noted tonight), "ok", or
        "missing" tonight."""
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
# 0.01%). Wall time ("rtf", "seconds") keeps the module's defaults; instruction counts (harness.counts.instructions)
# have floors set from what an ordinary change moves a count by (docs/nightly.md, "Three signals"). Exact
# counts (harness.counts.structure, metric "ops") are not a statistic: `scan_exact` names every change.
METRIC_RULES = {
    "instructions": dict(step_floor=0.01, drift_floor=0.005, min_sigma=0.0005),
}
EXACT_METRICS = ("ops",)
WALL_METRICS = ("rtf", "seconds")
# the exact counters of a point (harness.counts.structure): more of any one is more work
COUNTERS = ("ops", "bytes", "flops", "llm_calls", "llm_positions", "head_rows", "embedded_positions",
            "reference_encodes")


def moves(before: dict, after: dict) -> list:
    """(name, before, after, unit) of every counter, then every operator kind, whose count differs between two
    nights' counts of one point."""
    out = [(k, before.get(k, 0), after.get(k, 0), "") for k in COUNTERS if before.get(k, 0) != after.get(k, 0)]
    kinds_a, kinds_b = before.get("by_kind", {}), after.get("by_kind", {})
    out += [(op, kinds_a.get(op, 0), kinds_b.get(op, 0), " calls") for op in sorted(set(kinds_a) | set(kinds_b))
            if kinds_a.get(op, 0) != kinds_b.get(op, 0)]
    return out


def differences(before: dict, after: dict) -> list:
    """What changed between two nights' counts of one point, exactly: each counter, then each operator."""
    return [f"{name}: {a:,} -> {b:,}{unit} ({b - a:+,})" for name, a, b, unit in moves(before, after)]


def exact_kind(before: dict, after: dict) -> str | None:
    """How two nights' counts differ: None (the same), "slower" (more of something, less of nothing), "faster" (less
    of something, more of nothing) or "changed" (more of some counter or operator kind and less of another: a mix
    whose cost the counts cannot rank, so it is judged as a slowdown is)."""
    found = moves(before, after)
    more, fewer = any(b > a for _, a, b, _ in found), any(b < a for _, a, b, _ in found)
    if more and fewer:
        return "changed"
    return "slower" if more else "faster" if fewer else None


def rule_for(metric: str, points: int, alpha: float = ALPHA, histories: int = len(STATISTICAL_HISTORIES)) -> Rule:
    return Rule(points=points, alpha=alpha, histories=histories, **METRIC_RULES.get(metric, {}))


def exact_counts(night, point: str) -> dict:
    """A night's exact counts of a point: the sample (operator calls) and the counters in its `extra`."""
    entry = night.points[point]
    return {"ops": int(entry["samples"][0]), **{k: v for k, v in (entry.get("extra") or {}).items()}}


def scan_exact(counts: list, accepted=frozenset()) -> Trace:
    """Exact counts night by night (dicts: counter -> number, "by_kind" -> {operator: calls}): the first night is the
    level; a night whose counts differ from it is a change, named exactly (`differences`). More of any counter or
    operator kind and less of none is a slowdown ("slower"); more of some and less of others is a changed mix
    ("changed": four adds turned into four exps leave the totals equal, not the cost); either stays open until the
    counts return to the level or it is accepted (that night's counts become the level). Less of some and more of
    none is noted ("faster"), and its counts become the level."""
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
        kind = exact_kind(level, now)
        event = Event(kind=kind, rule="exact", began=t, alarmed=t, z=math.inf,
                      level=float(level.get("ops", 0)),
                      change=now["ops"] / level["ops"] - 1 if level.get("ops") else 0.0, detail=changed)
        trace.events.append(event)
        if kind in ALARM_KINDS and t not in accepted:
            current = event
            trace.status.append("alarm")
        else:
            event.status, event.closed, level = ("accepted" if kind in ALARM_KINDS else "noted"), t, now
            trace.status.append("ok")
    return trace


def unjudged(history) -> list:
    """Points whose metric is a wait that may be 0 (baselines.NON_NEGATIVE: no log, no ratio); `compare` judges
    those against a baseline."""
    from harness.speed.baselines import NON_NEGATIVE

    return [p for p in history.point_names
            if any(n.points.get(p, {}).get("metric") in NON_NEGATIVE for n in history.nights)]


JUDGE_BUSY = "judge-busy"  # a night's label (`nightly append --label`): judge its wall time whatever its load says


def busy_nights(nights: list) -> dict:
    """{position: why} of the nights measured beside competing work (harness.speed.conditions.busy), but those
    appended with the label JUDGE_BUSY (the person says the load is the runner's normal, not competing work)."""
    from harness.speed.conditions import busy

    return {i: why for i, n in enumerate(nights)
            if JUDGE_BUSY not in n.labels and (why := busy((n.machine or {}).get("conditions")))}


def seen_through(nights: list, began: int, date: str | None) -> int:
    """The last night (position) measured before an acceptance made at ``date``: the nights the person saw, which are
    part of what was accepted; from the next one on, nights are judged against the accepted level. Without a date
    (a hand-written entry), the accepted night itself."""
    from datetime import datetime, timezone

    def when(text):  # a date without a zone is UTC (pytest-benchmark's "datetime")
        try:
            moment = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
        except ValueError:
            return None
        return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)

    at = when(date) if date else None
    last = began
    if at is not None:
        for i in range(began + 1, len(nights)):
            night = when(nights[i].date)
            if night is None or night > at:
                break
            last = i
    return last


def is_statistical(history) -> bool:
    """Whether a history spends a share of the suite's alpha: it has a point judged with noise (wall time,
    instructions), not exact counts alone."""
    skip = set(unjudged(history))
    return any(n.points[p].get("metric") not in EXACT_METRICS for n in history.nights for p in n.points
               if p not in skip)


def name_causes(trace: Trace, nights: list) -> None:
    """Each change that began on a night whose versions differ from the night before it (the point's previous
    night) names them (``Event.versions``: "torch 2.14.1 -> 2.15.0") as its likely cause. The change was judged as
    any: a change of versions is neither a free pass nor a penalty."""
    from harness.nightly.versions import changed_versions

    for event in trace.events:
        if event.began > 0:
            event.versions = changed_versions(nights[event.began - 1].versions, nights[event.began].versions)


def check_history(history, alpha: float = ALPHA, histories: int = len(STATISTICAL_HISTORIES)) -> list:
    """PointReport for every point of a history (but the `unjudged` ones): each with its metric's rule, the
    history's share of the suite's budget (alpha / ``histories``) split over its points judged statistically.
    Wall-time nights measured beside competing work are not judged; each report carries the history's limit on
    such nights in a row (``not_judged_limit``)."""
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
        accepted = {position[a["night"]]: seen_through(nights, position[a["night"]], a.get("date"))
                    for a in history.accepted if a["point"] == name and a["night"] in position}
        not_judged = busy_nights(nights) if metric in WALL_METRICS else {}
        rule = None
        if metric in EXACT_METRICS:
            trace = scan_exact([exact_counts(n, name) for n in nights], accepted)
        else:
            within = [within_night_sigma(n.points[name]["samples"]) for n in nights]
            rule = rule_for(metric, max(len(statistical), 1), alpha, histories)
            trace = scan(x, within, rule, accepted, frozenset(not_judged))
        name_causes(trace, nights)
        reports.append(PointReport(point=name, metric=metric, nights=nights, x=x, trace=trace,
                                   tonight=nights[-1].id == latest, not_judged=not_judged, rule=rule,
                                   not_judged_limit=history.not_judged_limit))
    return reports
