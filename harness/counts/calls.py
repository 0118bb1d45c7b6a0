"""The nightly counting points: one call each, made the same way for every counter (instructions under callgrind,
operators and bytes, the work counters), with a window around the part that is counted.

A point (fixtures/points.json, "counts") names a checkpoint size, a text, a voice, a step count and what is counted:

- `generate`: one whole `model.generate` call (text preparation, reference prompt from memory, the unmasking loop,
  decoding);
- `loop`: the unmasking loop only (`_generate_iterative` on the prepared task), the LLM forwards and the scoring,
  nothing else run: on the full-size model, where a whole call under valgrind would spend most of its time in text
  preparation and the full-size decoder;
- `first-chunk`: `fastpath.stream` up to its first piece of audio (time to first audio), with the stream's worker
  held before its second chunk, so that what runs in the window is the same work every time.

Variants: `stock` (no patch) and `lossless` (every lossless patch). `make_call(model, point, variant, prompts)`
returns `call(window)`: one run of the point, seeded, with `window()` (a context manager) entered around the counted
part. Counters that see one thread only (callgrind's collection, a dispatch mode) also give `window.worker()`: the
stream makes its chunks in a worker thread, and the first chunk's unmasking loop is counted there with it (a window
without `worker` counts what its own thread runs).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

from harness.model.points import Point, load_spec

VARIANTS = ("stock", "lossless")
WHAT = ("generate", "loop", "first-chunk")
SEED = 0


@dataclass(frozen=True)
class CountPoint:
    name: str
    size: str  # "tiny" or "full"
    text: str  # a key of points.json "texts"
    voice: str  # a key of points.json "voices"
    num_step: int
    what: str = "generate"
    warmup_text: str | None = None  # a cheaper text for the warm-up call (the full-size point under valgrind)

    def generate_kwargs(self, model, prompts: dict, text: str | None = None) -> dict:
        """The generate() kwargs, as the speed tier builds them (voice prompts encoded once, in `prompts`)."""
        return Point(text or self.text, self.voice, self.num_step, 0.0).generate_kwargs(model, prompts)


def load_points() -> list:
    points = [CountPoint(**p) for p in load_spec()["counts"]]
    bad = [p.name for p in points if p.what not in WHAT or p.size not in ("tiny", "full")]
    if bad:
        raise ValueError(f"fixtures/points.json 'counts': points {bad} have an unknown 'what' (one of {WHAT}) or size")
    return points


def point_named(name: str) -> CountPoint:
    known = {p.name: p for p in load_points()}
    if name not in known:
        raise KeyError(f"no counting point {name!r}; known: {sorted(known)} (fixtures/points.json, 'counts')")
    return known[name]


def patches_of(variant: str) -> list:
    import fastpath

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {VARIANTS}")
    return list(fastpath.LOSSLESS) if variant == "lossless" else []


def make_call(model, point: CountPoint, variant: str, prompts: dict, warmup: bool = False):
    """`call(window)`: one seeded run of `point` on `model` with `variant`'s patches, `window()` around the part
    counted. Patches are applied and reverted outside the window. `warmup`: the point's warm-up call (its
    `warmup_text`, if it has one: the same code on fewer positions)."""
    import torch

    import fastpath
    from fastpath.instance import overridden

    kwargs = point.generate_kwargs(model, prompts, point.warmup_text if warmup else None)
    patches = patches_of(variant)

    def generate(window):
        with fastpath.patched(model, patches), window():
            torch.manual_seed(SEED)
            model.generate(**kwargs)

    def loop(window):  # the unmasking loop alone: no text preparation or decoding around it, not even uncounted
        from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

        config = OmniVoiceGenerationConfig.from_dict(kwargs)
        prep = {k: v for k, v in kwargs.items() if k in ("text", "language", "voice_clone_prompt", "instruct")}
        with fastpath.patched(model, patches), torch.inference_mode():
            task = model._preprocess_all(**prep, preprocess_prompt=config.preprocess_prompt)
            torch.manual_seed(SEED)
            with window():
                model._generate_iterative(task, config)

    def first_chunk(window):
        chunk, release = [], threading.Event()
        in_worker = getattr(window, "worker", contextlib.nullcontext)  # the stream computes in its own thread

        def hold(iterate):
            def run(task, gen_config):
                chunk.append(1)
                if len(chunk) == 1:  # chunk 0: counted in the worker thread too
                    with in_worker():
                        return iterate(task, gen_config)
                if len(chunk) == 2:  # the worker would make chunk 1 while the caller decodes chunk 0
                    release.wait(600)
                return iterate(task, gen_config)

            return run

        stream_kwargs = {k: v for k, v in kwargs.items() if k != "text"}
        with fastpath.patched(model, patches), overridden(model, "_generate_iterative", hold):
            torch.manual_seed(SEED)
            with window():
                stream = fastpath.stream(model, kwargs["text"], **stream_kwargs)
                next(stream)
            release.set()
            stream.close()

    return {"generate": generate, "loop": loop, "first-chunk": first_chunk}[point.what]


def add_arguments(parser) -> None:
    """--points, --variants, --out: the options of every counting verb (instructions, structure)."""
    from pathlib import Path

    parser.add_argument("--points", nargs="+", default=None,
                        help="counting points (fixtures/points.json 'counts'; default: all)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=None, help="write the run file (for `nightly append`)")


def nothing():
    return contextlib.nullcontext()
