"""Operating characteristics of the SIM and MOS gates, and of the stream voice check, on real speech (espeak-ng).

SIM (cloned voice): every sentence has a speaker (one of SPEAKERS, by position) whose voice prompt is the render of
PROMPT_TEXT in that voice; a clip is the sentence in that voice at a seed's rate and pitch (jittered within the
voice). The equivalent candidate is other seeds of the same voices. A voice change is the candidate's audio shifted
in pitch and formants together (resampled by a factor f and played at the old rate); f is chosen by measuring,
on a calibration set of its own seeds, the ΔSIM that f causes, so that the true ΔSIM of the "at the margin" and
"twice the margin" rows is known (`calibrate`: a grid of f, interpolated, one secant step; the calibration's f and
ΔSIM are in the results).

MOS: the same renders; the damaged candidates are the equivalent set with white noise at 20 dB and 10 dB SNR,
band-limited to 4 kHz, or hard-clipped at a third of its peak. Damage is drawn per clip and seed, so repetitions
that share a pool seed share its clips, and the caches of renders, embeddings and scores make reruns quick.

Stream voice: streams of STREAM_CHUNKS sentences, each chunk rendered on its own (rate and pitch jittered, as the
chunks of fastpath.stream are generated one by one); "one voice" streams keep their speaker, "switch" streams
change it at one seam (to another male variant, or to a female voice). The check (voice.seam_check) should pass
the first and refuse the second.

A repetition draws, for every sentence, 2k distinct seeds from a pool of POOL (k for the reference, k for the
candidate), shared by every case of that repetition.

    fastpath-suite audit known-answer --metric sim --reps 20 --results results/
    fastpath-suite audit known-answer --metric mos --reps 20 --results results/
    fastpath-suite audit known-answer --metric stream --results results/
"""

from __future__ import annotations

import dataclasses
import hashlib
from fractions import Fraction
from typing import Sequence

import numpy as np

from harness.run.progress import QUIET, Progress

from harness.quality import corpus, mos, speech, stats, voice
from harness.quality.audio import Clip

SPEAKERS = ("en-us+m1", "en-us+m3", "en-us+m7", "en-us+m2")
PROMPT_TEXT = ("The morning train was quiet, so she read the paper and watched the fields go by until the city "
               "came into view.")
RATES = (160, 190)
PITCHES = (45, 55)  # jitter within one voice (espeak's default 50)
SEEDS = 3
POOL = 8
CALIBRATION_SEEDS = range(100, 104)  # seeds of the calibration set: apart from the pool the table draws from
FEMALE = ("en-us+f1", "en-us+f2", "en-us+f3", "en-us+f4")
STREAM_CHUNKS = 3


def _rng(*parts) -> np.random.Generator:
    return np.random.default_rng([int(hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:8], 16)])


def speaker_of(index: int) -> str:
    return SPEAKERS[index % len(SPEAKERS)]


def render_in_voice(item: corpus.Item, voice_name: str, seed: int) -> tuple[np.ndarray, int]:
    rng = _rng(item.id, seed, "voice")
    return speech.render(item.text, voice_name, int(rng.integers(RATES[0], RATES[1] + 1)),
                         int(rng.integers(PITCHES[0], PITCHES[1] + 1)))


def prompt_audio(voice_name: str) -> tuple[np.ndarray, int]:
    return speech.render(PROMPT_TEXT, voice_name)


def shift(wav: np.ndarray, sr: int, factor: float) -> np.ndarray:
    """Pitch and formants up by `factor` (duration down by it): resampled to sr / factor, played at sr."""
    if factor == 1.0:
        return wav
    from scipy.signal import resample_poly

    ratio = Fraction(factor).limit_denominator(200)
    return resample_poly(wav, ratio.denominator, ratio.numerator).astype(np.float32)


def noise(wav: np.ndarray, snr_db: float, rng) -> np.ndarray:
    power = float(np.mean(wav.astype(np.float64) ** 2))
    return (wav + rng.standard_normal(wav.size) * np.sqrt(power / 10 ** (snr_db / 10))).astype(np.float32)


def band_limit(wav: np.ndarray, sr: int, hz: float = 4000.0) -> np.ndarray:
    from scipy.signal import butter, sosfiltfilt

    return sosfiltfilt(butter(8, hz, fs=sr, output="sos"), wav).astype(np.float32)


def hard_clip(wav: np.ndarray, fraction: float = 1 / 3) -> np.ndarray:
    level = fraction * float(np.max(np.abs(wav)))
    return np.clip(wav, -level, level)


DAMAGES = {
    "noise-20db": lambda w, sr, rng: noise(w, 20.0, rng),
    "noise-10db": lambda w, sr, rng: noise(w, 10.0, rng),
    "band-4khz": lambda w, sr, rng: band_limit(w, sr),
    "clipped": lambda w, sr, rng: hard_clip(w),
}


def clip(items: Sequence[corpus.Item], g: int, seed: int, slot: int, damage: str = "none",
         factor: float = 1.0) -> Clip:
    """Sentence g at a pool seed in its speaker's voice, shifted by `factor` and damaged by DAMAGES[damage]."""
    item = items[g]
    wav, sr = render_in_voice(item, speaker_of(g), seed)
    wav = shift(wav, sr, factor)
    if damage != "none":
        wav = DAMAGES[damage](wav, sr, _rng(item.id, seed, damage))
    return Clip(f"{item.id}#{slot}", item.text, wav, sr, group=item.id, seed=seed)


def sims(judge, items, clips_: Sequence[Clip]) -> np.ndarray:
    """[N] SIM of every clip to its sentence's speaker's prompt."""
    index = {it.id: g for g, it in enumerate(items)}
    return np.array([judge.similarity((c.wav, c.sr), prompt_audio(speaker_of(index[c.group]))) for c in clips_])


GRID = (1.01, 1.02, 1.03, 1.04, 1.05, 1.06, 1.08)  # shift factors the calibration measures


def calibrate(judge, items, targets: Sequence[float], progress: Progress = QUIET) -> dict:
    """{target: (f, ΔSIM at f, its SE)}: the mean paired SIM change of every calibration clip (each sentence at
    CALIBRATION_SEEDS, apart from the table's pool) over GRID, f interpolated where the curve crosses -target,
    then measured there."""
    specs = [(g, s, j) for g in range(len(items)) for j, s in enumerate(CALIBRATION_SEEDS)]
    s0 = sims(judge, items, [clip(items, *x) for x in specs])

    def change(f):
        d = sims(judge, items, [clip(items, *x, factor=f) for x in specs]) - s0
        return float(d.mean()), float(d.std(ddof=1) / np.sqrt(d.size))

    curve = []
    with progress.stage("calibrate the voice shift (SIM change by factor)", len(GRID) + len(targets)) as step:
        for f in GRID:
            curve.append(change(f)[0])
            step(f"x{f}: ΔSIM {curve[-1]:+.4f}")
        out = {}
        for target in targets:
            # np.interp needs increasing x: the curve falls with f, so interpolate f over -ΔSIM; then one secant
            # step from the measured point along the grid's local slope (the curve bends between grid points)
            f = float(np.interp(target, -np.array(curve), GRID))
            d = change(f)[0]
            slope = float(np.interp(f, GRID[1:], np.diff(curve) / np.diff(GRID)))
            f = f + (-target - d) / slope if slope < 0 else f
            out[target] = (f, *change(f))
            step(f"x{f:.4f} for ΔSIM {-target:+.4f}: measured {out[target][1]:+.4f}")
    return out


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    metric: str  # sim | mos
    want: str  # pass >= 80% | pass <= 5% | refused >= 95%
    damage: str = "none"
    times_margin: float = 0.0  # sim: the voice shift's true ΔSIM in margins


CASES = {
    "sim": (Case("equivalent set (other seeds, same voices)", "sim", "pass >= 80%"),
            Case("voice shifted by the margin", "sim", "pass <= 5%", times_margin=1.0),
            Case("voice shifted by 2x the margin", "sim", "refused >= 95%", times_margin=2.0)),
    "mos": (Case("equivalent set (other seeds)", "mos", "pass >= 80%"),
            Case("white noise at 20 dB SNR", "mos", "refused >= 95%", damage="noise-20db"),
            Case("white noise at 10 dB SNR", "mos", "refused >= 95%", damage="noise-10db"),
            Case("band-limited to 4 kHz", "mos", "refused >= 95%", damage="band-4khz"),
            Case("hard-clipped at a third of the peak", "mos", "refused >= 95%", damage="clipped")),
}


def meets(want: str, rate: float) -> bool:
    return {"pass >= 80%": rate >= 0.8, "pass <= 5%": rate <= 0.05, "refused >= 95%": rate <= 0.05}[want]


def draws(items, reps: int, seeds: int, seed: int = 0) -> list[np.ndarray]:
    """[G, 2k] distinct pool seeds per sentence, one array per repetition."""
    out = []
    for rep in range(reps):
        pick = np.random.default_rng([seed, 2000 + rep])
        out.append(np.array([pick.choice(POOL, 2 * seeds, replace=False) for _ in items]))
    return out


def run(metric: str, reps: int, seeds: int = SEEDS, items=None, progress: Progress = QUIET, log=print,
        cases: Sequence[Case] | None = None) -> dict:
    """Every case of `metric` `reps` times; the figures of a results file (`render_results` makes the table)."""
    items = items if items is not None else corpus.load_corpus("dev")
    cases = cases if cases is not None else CASES[metric]
    judge = voice.load_voice_judge() if metric == "sim" else mos.load_mos_judge()
    margin = stats.SIM_MARGIN if metric == "sim" else stats.MOS_MARGIN
    times = sorted({c.times_margin for c in cases if c.times_margin})
    found = calibrate(judge, items, [t * margin for t in times], progress) if times else {}
    factors = {t: found[t * margin] for t in times}
    for t, (f, d, se) in factors.items():
        log(f"voice shift for {t:g}x the margin: x{f:.4f}, ΔSIM {d:+.4f} (SE {se:.4f})")

    def gates(ref, cand, label):
        """The verdicts of the metric: SIM's one, or MOS's two (OVRL and P808; MOS passes when both pass)."""
        groups = [x.group for x in ref]
        if metric == "sim":
            return [stats.score_gate("SIM", stats.SIM_UNIT, sims(judge, items, ref), sims(judge, items, cand), groups,
                                     margin, judge.identity, label=label)]
        return [stats.score_gate(name, unit, mos.mos_scores(judge, ref, field), mos.mos_scores(judge, cand, field),
                                 groups, margin, judge.identity, label=label) for name, field, unit in stats.MOS_FIELDS]

    chosen = draws(items, reps, seeds)
    rows = []
    with progress.stage(f"{metric}: gate every case", len(cases) * reps) as step:
        for case in cases:
            verdicts = []
            for rep in range(reps):
                c = chosen[rep]
                ref = [clip(items, g, int(c[g, j]), j) for g in range(len(items)) for j in range(seeds)]
                f = factors[case.times_margin][0] if case.times_margin else 1.0
                cand = [clip(items, g, int(c[g, seeds + j]), j, case.damage, f) for g in range(len(items))
                        for j in range(seeds)]
                verdicts.append(gates(ref, cand, case.name))
                step(f"{case.name}, repetition {rep + 1}/{reps}: " + ", ".join(v.verdict for v in verdicts[-1]))
            passed = sum(all(v.passed for v in vs) for vs in verdicts)
            per = {}
            for k, v0 in enumerate(verdicts[0]):
                d = [vs[k].delta for vs in verdicts]
                per[v0.metric] = {"passed": sum(vs[k].passed for vs in verdicts), "delta_mean": float(np.mean(d)),
                                  "delta_sd": float(np.std(d, ddof=1)) if reps > 1 else 0.0,
                                  "lower_mean": float(np.mean([vs[k].lower for vs in verdicts]))}
            rows.append({"case": case.name, "want": case.want, "repetitions": reps, "passed": passed,
                         "pass_rate": passed / reps, "meets": meets(case.want, passed / reps),
                         "true_delta": factors[case.times_margin][1] if case.times_margin else None,
                         "metrics": per, "verdicts": [[v.verdict for v in vs] for vs in verdicts]})
            log(f"{case.name}: passed {passed}/{reps}")
    return {"metric": metric, "margin": margin, "seeds": seeds, "reps": reps, "sentences": len(items),
            "pool": POOL, "judge": judge.identity, "espeak": speech.espeak_version(),
            "calibration": {str(k): {"factor": v[0], "true_delta": v[1], "se": v[2]} for k, v in factors.items()},
            "rows": rows}


def render_results(figures: dict) -> str:
    """The table of a run's figures (`run`): one row per case, each gated metric's passes and mean Δ beside the
    case's (a MOS case passes when OVRL and P808 both pass)."""
    sim = figures["metric"] == "sim"
    names = list(figures["rows"][0]["metrics"]) if figures["rows"] else []
    judge = ("SIM: GE2E cosine (resemblyzer), not the papers’ WavLM-ECAPA" if sim else
             "MOS: DNSMOS OVRL and P.808 (speechmos), not the papers’ UTMOS")
    lines = [f"{judge}; margin {figures['margin']:g}; {figures['sentences']} sentences x {figures['seeds']} seeds a "
             "set; "
             f"{figures['reps']} repetitions a row; espeak-ng {figures['espeak']}.", ""]
    for times, cal in figures.get("calibration", {}).items():
        lines.append(f"- voice shift for {float(times):g}x the margin: pitch and formants x{cal['factor']:.4f}, true "
                     f"ΔSIM {cal['true_delta']:+.4f} (SE {cal['se']:.4f}, measured on the calibration set)")
    if figures.get("calibration"):
        lines.append("")
    head = "".join(f"{n}: passed, Δ mean (sd), lower bound mean | " for n in names)
    lines += [f"| case | criterion | passed | {head}met |", "|---|---|---|" + "---|" * len(names) + "---|"]
    for r in figures["rows"]:
        cells = "".join(f"{m['passed']}/{r['repetitions']}, {m['delta_mean']:+.4f} ({m['delta_sd']:.4f}), "
                        f"{m['lower_mean']:+.4f} | " for m in r["metrics"].values())
        lines.append(f"| {r['case']} | {r['want']} | {r['passed']}/{r['repetitions']} ({r['pass_rate']:.0%}) | {cells}"
                     f"{'yes' if r['meets'] else 'NO'} |")
    return "\n".join(lines)


# -- the stream voice check ------------------------------------------------------------------------------------

def stream_chunks(items, start: int, speaker: str, seed: int, switch_to: str | None = None,
                  at: int = 1) -> tuple[list[np.ndarray], int]:
    """(STREAM_CHUNKS consecutive sentences from `start`, each its own render in `speaker`'s voice, from chunk `at`
    on in `switch_to`'s (when given); their sample rate)."""
    out, sr = [], None
    for k in range(STREAM_CHUNKS):
        who = switch_to if switch_to is not None and k >= at else speaker
        wav, sr = render_in_voice(items[(start + k) % len(items)], who, seed)
        out.append(wav)
    return out, sr


# The criteria of the stream check's rows. A switch between male variants has none: GE2E hears some of espeak's
# male variants as nearly one voice (m1 and m3: 0.85-0.90 across a seam, within the range of one voice), so the row
# reports how often such a switch is caught rather than promising it.
STREAM_WANT = {"one voice": "refused <= 5%", "switch to another male speaker": "none: reported",
               "switch to a female voice": "refused >= 95%"}


def run_stream(streams: int = 40, items=None, progress: Progress = QUIET, log=print,
               floor: float = voice.SEAM_FLOOR) -> dict:
    """`streams` streams of each kind (one voice; a switch to another male speaker; a switch to a female voice),
    each checked by voice.seam_check; the seams' SIM and each kind's refusal rate."""
    items = items if items is not None else corpus.load_corpus("dev")
    judge = voice.load_voice_judge()
    kinds = {"one voice": lambda i, sp: None,
             "switch to another male speaker": lambda i, sp: SPEAKERS[(SPEAKERS.index(sp) + 1 + i % 3) % 4],
             "switch to a female voice": lambda i, sp: FEMALE[i % len(FEMALE)]}
    rows = []
    with progress.stage("stream voice: check every stream", len(kinds) * streams) as step:
        for name, other in kinds.items():
            refused, lowest = 0, []
            for i in range(streams):
                sp = SPEAKERS[i % len(SPEAKERS)]
                chunks, sr = stream_chunks(items, 3 * i, sp, seed=i, switch_to=other(i, sp), at=1 + i % 2)
                check = voice.seam_check(judge, chunks, sr, floor)
                refused += not check.passed
                lowest.append(min(check.seams))
                step(f"{name} {i + 1}/{streams}: {'refused' if not check.passed else 'passed'}")
            want = STREAM_WANT[name]
            rate = refused / streams
            rows.append({"case": name, "want": want, "streams": streams, "refused": refused, "refused_rate": rate,
                         "meets": {"refused <= 5%": rate <= 0.05, "refused >= 95%": rate >= 0.95}.get(want),
                         "lowest_seam": {"min": float(np.min(lowest)), "median": float(np.median(lowest)),
                                         "max": float(np.max(lowest))}})
            log(f"{name}: refused {refused}/{streams}")
    return {"floor": floor, "chunks": STREAM_CHUNKS, "streams": streams, "judge": judge.identity,
            "espeak": speech.espeak_version(), "rows": rows}


def render_stream_results(figures: dict) -> str:
    lines = [f"Streams of {figures['chunks']} chunks (one espeak-ng render a sentence), {figures['streams']} of each "
             f"kind; refused when SIM between consecutive chunks is below {figures['floor']:g} at any seam (GE2E "
             f"cosine); espeak-ng {figures['espeak']}.", "",
             "| streams | criterion | refused | lowest seam SIM: min / median / max | met |", "|---|---|---|---|---|"]
    for r in figures["rows"]:
        s = r["lowest_seam"]
        met = "-" if r["meets"] is None else "yes" if r["meets"] else "NO"
        lines.append(f"| {r['case']} | {r['want']} | {r['refused']}/{r['streams']} ({r['refused_rate']:.0%}) | "
                     f"{s['min']:.3f} / {s['median']:.3f} / {s['max']:.3f} | {met} |")
    return "\n".join(lines)


def main(args, progress: Progress) -> int:
    """`fastpath-suite audit known-answer --metric sim|mos|stream` (harness.audit.known_answer parses the options)."""
    from harness.run import results

    if args.metric == "stream":
        data = run_stream(args.streams, progress=progress, log=progress.say)
        print(render_stream_results(data))
        results.write_if_asked(args, "stream-voice", data)
        return 0 if all(r["meets"] is not False for r in data["rows"]) else 1
    data = run(args.metric, args.reps, args.seeds, progress=progress, log=progress.say)
    print(render_results(data))
    results.write_if_asked(args, f"known-answer-{args.metric}", data)
    return 0 if all(r["meets"] for r in data["rows"]) else 1
