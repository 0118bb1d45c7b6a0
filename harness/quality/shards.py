"""An evaluation set generated and judged over several workers, with the verdict of the whole set judged at once.

Thousands of items (Seed-TTS-eval: 1,088 English, 2,020 Chinese) take hours one at a time. The items are split
deterministically (worker k of n takes the set's items k, k+n, k+2n, ...: `split`), each worker generates its
items (harness.quality.clone_run --shard k/n: the same per-item seed, so the same output as a serial run) and then
judges them (`python -m harness.quality.shards judge ...`: each item's transcripts, SIM and MOS, one JSON file per
worker). The figures are merged in the set's order and one verdict is computed from them by the same code as a
serial comparison (evaluate.decide on evaluate.judge_figures' figures: a clip's figure is its own, whatever else is
judged beside it), so the sharded verdict is the serial one.

A worker that dies, or an item whose judging fails, is named with its items, exit and log (ShardFailure); no item
is dropped and no verdict is given without every item. Workers run on harness.run.workers' engines: processes on this
machine (one GPU each with `gpus`), or Ray tasks on a cluster (docs/sharding.md).

    python -m harness.quality.shards judge SET REF_DIR CAND_DIR --shard K/N --out FILE [--metrics wer,sim,mos]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from harness.run.workers import Job, run_jobs


class ShardFailure(RuntimeError):
    """Workers that died or items that failed, each named; the set has no verdict without them."""

    def __init__(self, what: str, problems: list[str]):
        self.problems = list(problems)
        super().__init__(f"{what}: {len(self.problems)} problem(s); every item is judged or the set has no "
                         f"verdict:\n" + "\n".join(f"  {p}" for p in self.problems))


def parse_shard(text: str) -> tuple[int, int]:
    """"K/N" -> (K, N), 0 <= K < N."""
    try:
        k, n = (int(t) for t in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not K/N (e.g. 0/4: the first of four workers)") from None
    if not 0 <= k < n:
        raise argparse.ArgumentTypeError(f"{text!r}: K must be 0 to N-1")
    return k, n


def split(items, n: int) -> list[tuple]:
    """Worker k's items: the set's items k, k+n, k+2n, ... (each prompt's items spread over the workers)."""
    return [tuple(items[k::n]) for k in range(n)]


def subset(eval_set, items):
    return dataclasses.replace(eval_set, items=tuple(items))


def generate(set_path, out: Path, workers: int, synth: str, python=sys.executable, checkpoint: str | None = None,
             extra_env: dict | None = None, engine: str = "local", gpus=None, logs: Path | None = None,
             timeout: float | None = None, log=print, extra_args: tuple = ()) -> None:
    """Every item of the set generated into `out` by `workers` clone_run processes of `python` (an environment's
    interpreter), worker k its `split` share; ShardFailure names each worker that failed and its items."""
    from . import sets

    eval_set = sets.read_set(set_path)
    logs = Path(logs or out.parent)
    jobs = [Job(f"generating shard {k} of {workers}",
                (str(python), "-m", "harness.quality.clone_run", str(Path(set_path).resolve()), str(out), "--synth",
                 synth, "--shard", f"{k}/{workers}") + (("--checkpoint", checkpoint) if checkpoint else ())
                + (("--device", "cuda") if gpus else ()) + tuple(extra_args),  # each worker's one GPU: cuda:0
                logs / f"{out.name}-generate-{k}-of-{workers}.log", dict(extra_env or {}))
            for k in range(workers)]
    done = run_jobs(jobs, engine, gpus=gpus, timeout=timeout, log=log)
    shares = split(eval_set.items, workers)
    failed = [f"{d.why()}: items {', '.join(i.id for i in share)}" for d, share in zip(done, shares) if not d.ok]
    if failed:
        raise ShardFailure(f"generating {eval_set.path} into {out}", failed)


def judge_worker(set_path, ref_dir, cand_dir, shard: tuple[int, int], out: Path, metrics=("wer", "sim", "mos"),
                 judges: dict | None = None, log=print) -> dict:
    """Worker k of n: every one of its items judged on its own (an item that fails is recorded with its error and the
    rest go on), written to `out` after each item (a worker that dies leaves what it finished)."""
    from harness.quality.cache import atomic_write

    from . import evaluate, sets

    eval_set = sets.read_set(set_path)
    k, n = shard
    mine = split(eval_set.items, n)[k]
    judge, voice_judge, mos_judge = load_judges(metrics, judges or {})
    record = {"shard": [k, n], "set": str(eval_set.path), "items": {}}
    start = time.perf_counter()
    for done, item in enumerate(mine, 1):
        try:
            one = subset(eval_set, [item])
            ref = evaluate.set_clips(one, ref_dir, "reference")
            cand = evaluate.set_clips(one, cand_dir, "candidate")
            figures = evaluate.judge_figures(judge, ref, cand, voice_judge, mos_judge, [item.prompt_audio()])
            record["items"][item.id] = {name: [_plain(pair[0][0]), _plain(pair[1][0])]
                                        for name, pair in figures.items()}
        except Exception as err:  # named in the verdict, never dropped
            record["items"][item.id] = {"error": f"{type(err).__name__}: {err}"}
        atomic_write(out, lambda tmp: tmp.write_text(json.dumps(record, indent=1)))
        took = time.perf_counter() - start
        log(f"[judge {k}/{n}] {done}/{len(mine)} items, {took:.0f} s, about {took / done * (len(mine) - done):.0f} "
            f"s left")
    return record


def _plain(value):
    return value if isinstance(value, str) else float(value)


def load_judges(metrics, judges: dict) -> tuple:
    """(WER judge, voice judge, MOS judge) for `metrics`, each None when left out; `judges` names non-default ones
    ({"wer": ..., "sim": ..., "mos": ...})."""
    from harness.quality import judge as wer_judge
    from harness.quality.mos import load_mos_judge
    from harness.quality.voice import load_voice_judge

    return (wer_judge.load_judge(judges.get("wer")) if "wer" in metrics else None,
            load_voice_judge(judges.get("sim")) if "sim" in metrics else None,
            load_mos_judge(judges.get("mos")) if "mos" in metrics else None)


def judge_set(set_path, ref_dir, cand_dir, workers: int, out: Path, metrics=("wer", "sim", "mos"),
              judges: dict | None = None, label: str = "", pack_dir=None, engine: str = "local",
              timeout: float | None = None, log=print, loaded: tuple | None = None):
    """The set's two output folders judged by `workers` workers, merged, and one verdict: what
    evaluate.compare_set_folders gives on the same folders (module docstring). Bad audio is refused here first, by
    the same check, before any worker starts. `loaded`: the (WER, voice, MOS) judges `judges` names, when the caller
    has them loaded already (the verdict needs their identities; the workers load their own)."""
    from . import audio, evaluate, sets

    eval_set = sets.read_set(set_path)
    judge, voice_judge, mos_judge = loaded or load_judges(metrics, judges or {})
    ref = evaluate.set_clips(eval_set, ref_dir, "reference")
    cand = evaluate.set_clips(eval_set, cand_dir, "candidate")
    prompts = [item.prompt_audio() for item in eval_set.items]
    problems = evaluate.bad_audio(ref, cand, voice_judge is not None, mos_judge is not None, prompts)
    if problems:
        refused = audio.Refused(tuple(problems), label)
        return evaluate.Comparison(refused, None, None, None, refused)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / f"judged-{k}-of-{workers}.json" for k in range(workers)]
    for f in files:
        f.unlink(missing_ok=True)  # figures of an earlier run are never merged into this one
    named = [a for key, flag in (("wer", "--judge"), ("sim", "--sim-judge"), ("mos", "--mos-judge"))
             if (judges or {}).get(key) for a in (flag, str(judges[key]))]
    jobs = [Job(f"judging shard {k} of {workers}",
                (sys.executable, "-m", "harness.quality.shards", "judge", str(Path(set_path).resolve()),
                 str(Path(ref_dir).resolve()), str(Path(cand_dir).resolve()), "--shard", f"{k}/{workers}", "--out",
                 str(files[k].resolve()), "--metrics", ",".join(metrics), *named),
                out / f"judge-{k}-of-{workers}.log")
            for k in range(workers)]
    log(f"[shards] judging {len(eval_set.items)} items on {', '.join(m.upper() for m in metrics)} over {workers} "
        f"workers ({engine})")
    done = run_jobs(jobs, engine, timeout=timeout, log=log)
    records = [json.loads(f.read_text()) if f.is_file() else None for f in files]
    figures = merge(eval_set, records, done)
    return evaluate.decide(judge, ref, cand, figures, label=label, pack_dir=pack_dir, voice_judge=voice_judge,
                           mos_judge=mos_judge)


def merge(eval_set, records: list[dict | None], done) -> dict:
    """The workers' per-item figures in the set's order: {"hyps": ([ref...], [cand...]), "SIM": (...), ...};
    ShardFailure names every worker that died and every item not judged."""
    problems = []
    shares = split(eval_set.items, len(records))
    for k, (record, d, share) in enumerate(zip(records, done, shares)):
        got = (record or {}).get("items", {})
        lost = [i.id for i in share if i.id not in got]
        if lost or not d.ok:
            problems.append(f"worker {k} of {len(records)}: {d.why()}" + (
                f"; gave no figures for {len(lost)} item(s): {', '.join(lost)}" if lost else ""))
        problems += [f"item {i}: {got[i]['error']} (worker {k}, log {d.job.log})" for i in sorted(got)
                     if "error" in got[i]]
    if problems:
        raise ShardFailure(f"judging {eval_set.path}", problems)
    by_id = {i: figures for record in records for i, figures in record["items"].items()}
    names = list(by_id[eval_set.items[0].id]) if eval_set.items else []
    return {name: ([by_id[i.id][name][0] for i in eval_set.items], [by_id[i.id][name][1] for i in eval_set.items])
            for name in names}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.quality.shards", description=__doc__.splitlines()[0],
                                     epilog="example: python -m harness.quality.shards judge set/meta.lst out/against "
                                            "out/candidate --shard 0/2 --out out/judged-0.json")
    verbs = parser.add_subparsers(dest="verb", required=True)
    j = verbs.add_parser("judge", help="judge one worker's share of a set's two output folders")
    j.add_argument("set")
    j.add_argument("ref_dir")
    j.add_argument("cand_dir")
    j.add_argument("--shard", type=parse_shard, required=True, help="K/N: worker K of N (from 0)")
    j.add_argument("--out", type=Path, required=True, help="the JSON file of this worker's per-item figures")
    j.add_argument("--metrics", default="wer,sim,mos", help="comma-separated: wer, sim, mos")
    for name in ("judge", "sim-judge", "mos-judge"):
        j.add_argument(f"--{name}", default=None, help=f"a non-default {name.replace('-', ' ')} (as the gate's)")
    args = parser.parse_args(argv)
    judges = {"wer": args.judge, "sim": args.sim_judge, "mos": args.mos_judge}
    judge_worker(args.set, args.ref_dir, args.cand_dir, args.shard, args.out, tuple(args.metrics.split(",")), judges,
                 log=lambda m: print(m, file=sys.stderr, flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
