"""Measuring `model.generate`: wall-clock RTF, interleaved A/B rounds, and noise-free work counters.

RTF = generate wall time / seconds of audio produced, with the device synchronised before each clock read.
The first call of each variant (warm-up: allocator, lazy init, compile or graph capture where a patch does it)
is timed on its own and reported as first-call latency, never mixed into the RTF samples.

Work counters do not use a clock: FLOPs per generate (torch.utils.flop_counter), LLM forward calls, positions
processed by the LLM, rows fed to the audio heads. They are exact on any machine, so they can gate in CI.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils.flop_counter import FlopCounterMode

import fastpath
from fastpath.gpu import synchronize
from fastpath.instance import overridden
from harness.run.machine import load_average


def timed_generate(model, seed: int | None, **kwargs) -> tuple:
    """(wall seconds, audio seconds) of one generate call, reseeded unless seed is None.

    Audio seconds are the generated frames / frame rate (25/s): the speech the model produced, before
    upstream's silence trimming and edge padding, which depend on what the audio sounds like, not on the work
    done; on real weights the two differ by the trimmed pauses only.
    """
    frames = []

    def counting_iterate(iterate):
        def count(task, gen_config, *rest):  # rest: a peer's own arguments (omnivoice_tts: its generator)
            out = iterate(task, gen_config, *rest)
            frames.extend(t.shape[-1] for t in out)
            return out

        return count

    with overridden(model, "_generate_iterative", counting_iterate):
        synchronize(model.device)
        if seed is not None:
            torch.manual_seed(seed)
        start = time.perf_counter()
        model.generate(**kwargs)
        synchronize(model.device)
        seconds = time.perf_counter() - start
    return seconds, sum(frames) / model.audio_tokenizer.config.frame_rate


def timed_calls(model, seed: int, calls: list) -> tuple:
    """(wall seconds, audio seconds) of several generate calls in a row (reseeded once), e.g. a batch's texts
    one call each."""
    wall = audio = 0.0
    torch.manual_seed(seed)
    for kwargs in calls:
        seconds, produced = timed_generate(model, None, **kwargs)
        wall, audio = wall + seconds, audio + produced
    return wall, audio


@dataclass
class Samples:
    name: str
    patches: tuple
    rtf: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    audio_seconds: float = 0.0
    first_call_seconds: float | None = None
    load: list = field(default_factory=list)  # 1-minute load average after each timed call (stability.judge)

    @property
    def median(self) -> float:
        return statistics.median(self.rtf)

    @property
    def iqr(self) -> float:
        q = statistics.quantiles(self.rtf, n=4) if len(self.rtf) > 1 else [self.rtf[0]] * 3
        return q[2] - q[0]

    def add(self, round_index: int, seconds: float, audio_seconds: float) -> None:
        """Round 0 is the warm-up: first-call latency, kept out of the RTF samples."""
        if round_index == 0:
            self.first_call_seconds = seconds
            return
        self.load.append(load_average())
        self.seconds.append(seconds)
        self.rtf.append(seconds / audio_seconds)
        self.audio_seconds = audio_seconds


def interleaved(model, variants: dict, kwargs: dict, rounds: int, seed: int = 0, overrides: dict | None = None,
                on_call=None) -> dict:
    """Time each variant (name -> patch names) `rounds` times, alternating A B A B, after one warm-up each.

    Interleaving spreads slow drifts of a shared machine (other load, clocks) over every variant alike, so
    their ratio is fair even when absolute times are not. `overrides` (name -> generate keyword arguments)
    changes a variant's settings, e.g. {"preset": {"num_step": 12}}. `kwargs` may be a list: one sample is
    then those calls in a row (`timed_calls`). `on_call(round, name)` runs after each call (progress).
    """
    overrides = overrides or {}
    out = {name: Samples(name, tuple(p)) for name, p in variants.items()}
    for r in range(rounds + 1):
        for name, patches in variants.items():
            with fastpath.patched(model, list(patches)):
                out[name].add(r, *timed(model, seed, kwargs, overrides.get(name, {})))
            if on_call:
                on_call(r, name)
    return out


def timed(model, seed, kwargs, overrides: dict) -> tuple:
    if isinstance(kwargs, list):
        return timed_calls(model, seed, [{**k, **overrides} for k in kwargs])
    return timed_generate(model, seed, **{**kwargs, **overrides})


def patched_if_any(model, names):
    """`fastpath.patched(model, names)`, or nothing for no names: a peer's own model class (not an
    omnivoice.OmniVoice, which fastpath refuses) runs unpatched."""
    from contextlib import nullcontext

    return fastpath.patched(model, list(names)) if names else nullcontext(model)


@dataclass
class Variant:
    """One timed configuration: a model instance, the patches it runs with, and generate overrides."""

    model: object
    patches: tuple = ()
    overrides: dict = field(default_factory=dict)


def interleaved_variants(variants: dict, kwargs: dict, rounds: int, seed: int = 0, on_call=None) -> dict:
    """`interleaved` for patches whose apply is costly to redo (graph captures, compiles): name -> Variant.

    Each model instance is patched once for the whole run (variants sharing a model must share its patches)
    and reverted at the end; process-global patches (`fastpath.registry.PROCESS_GLOBAL`, e.g. TF32 flags) are
    applied around each of their variant's calls only, so they never leak into another variant's timing. The
    first round is the warm-up (captures, compiles) and is reported as first-call latency. `on_call(round, name)`
    runs after each call (progress).
    """
    from contextlib import ExitStack

    from fastpath.registry import PROCESS_GLOBAL

    kept: dict = {}
    for name, v in variants.items():
        own = tuple(p for p in v.patches if p not in PROCESS_GLOBAL)
        model, first = kept.setdefault(id(v.model), (v.model, own))
        if set(first) != set(own):
            raise ValueError(f"variant {name!r} shares its model with another variant but patches it with {own}, "
                             f"not {first}; give it its own model instance")
    out = {name: Samples(name, tuple(v.patches)) for name, v in variants.items()}
    with ExitStack() as stack:
        for model, own in kept.values():
            stack.enter_context(patched_if_any(model, own))
        for r in range(rounds + 1):
            for name, v in variants.items():
                with patched_if_any(v.model, [p for p in v.patches if p in PROCESS_GLOBAL]):
                    out[name].add(r, *timed(v.model, seed, kwargs, v.overrides))
                if on_call:
                    on_call(r, name)
    return out


@dataclass
class Work:
    flops: int = 0
    llm_calls: int = 0
    llm_positions: int = 0  # sum over forward calls of batch x sequence positions the LLM ran on
    head_rows: int = 0  # positions fed to the audio heads
    embedded_positions: int = 0  # positions looked up in the audio embedding table (x 8 codebooks)
    reference_encodes: int = 0  # runs of the audio tokenizer's encoder (reference prompts)
    per_call_positions: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"flops": self.flops, "llm_calls": self.llm_calls, "llm_positions": self.llm_positions,
                "head_rows": self.head_rows, "embedded_positions": self.embedded_positions,
                "reference_encodes": self.reference_encodes}


def on_llm_forward(model, callback) -> list:
    """Call `callback(hidden)` once per LLM forward of `model`, with the hidden states the forward ran on
    ([batch, positions, hidden]), on every path: a call of `model.llm` (stock's, and a CUDA-graph or compiled forward
    that replaces its `forward`: a replay runs no submodule), counted after it returns; or, outside such a call, the
    LLM's final norm (fastpath's lean_llm restates the forward without calling model.llm, and runs that norm once).
    Returns the hook handles; `.remove()` each to undo."""
    inside: list = []

    def enter(module, args, kwargs):
        inside.append(kwargs.get("inputs_embeds", args[0] if args else None))

    def leave(module, args, kwargs, output):
        callback(inside.pop())

    def on_norm(module, args, output):
        if not inside:
            callback(args[0])

    return [model.llm.register_forward_pre_hook(enter, with_kwargs=True),
            model.llm.register_forward_hook(leave, with_kwargs=True),
            model.llm.norm.register_forward_hook(on_norm)]


@contextmanager
def counting(model):
    """Count LLM forwards, positions and head rows with forward hooks (removed on exit); an LLM forward is counted
    where `on_llm_forward` sees it, once on every path."""
    work = Work()

    def on_llm(hidden):
        positions = hidden.shape[0] * hidden.shape[1]  # [batch, positions, hidden]
        work.llm_calls += 1
        work.llm_positions += positions
        work.per_call_positions.append(positions)

    def on_heads(module, args, output):
        work.head_rows += args[0].numel() // args[0].shape[-1]

    def on_embed(module, args, output):
        ids = args[0]  # [B, C, S] shifted audio ids
        work.embedded_positions += ids.numel() // ids.shape[1]

    def on_encode(module, args, output):
        work.reference_encodes += 1

    hooks = [
        *on_llm_forward(model, on_llm),
        model.audio_heads.register_forward_hook(on_heads),
        model.audio_embeddings.register_forward_hook(on_embed),
    ]
    encoder = getattr(model.audio_tokenizer, "semantic_model", None)  # None in a decode-only codec (a peer's)
    if encoder is not None:
        hooks.append(encoder.register_forward_hook(on_encode))  # runs in encode() only
    try:
        yield work
    finally:
        for h in hooks:
            h.remove()


def slow_llm(model, fraction: float) -> list:
    """Make every LLM forward of `model` take (1 + fraction) x as long (the regression a speed gate must refuse):
    a sleep of fraction x the time from the step's input embedding (`model.audio_embeddings`) to the end of the
    forward as `on_llm_forward` sees it (every path: model.llm's own, a CUDA-graph replay, fastpath's lean_llm).
    Returns the hook handles; `.remove()` each to undo."""
    start: list = []

    def begin(module, args):
        start[:] = [time.perf_counter()]

    def end(hidden):
        if start:
            synchronize(hidden.device)  # on CUDA, the forward's kernels, not only their launches
            time.sleep(fraction * (time.perf_counter() - start.pop()))

    return [model.audio_embeddings.register_forward_pre_hook(begin), *on_llm_forward(model, end)]


def _cpu_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


# torch's flop counter knows the CUDA attention kernels, not the CPU one: count it as they are counted
CPU_ATTENTION_FLOPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops}


def count_work(model, seed: int = 0, whole_call: bool = False, **kwargs) -> Work:
    """Exact work of one generate: FLOPs of the unmasking loop (torch's flop counter, with the CPU attention kernel
    counted as the CUDA ones are; text preparation, reference encoding and waveform decoding are outside it, or
    inside with `whole_call`) plus the hook counts over the whole call."""
    flop_mode = FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS)

    def counted_iterate(iterate):
        def count(task, gen_config, *rest):
            with flop_mode:
                return iterate(task, gen_config, *rest)

        return count

    if whole_call:
        with counting(model) as work, flop_mode:
            torch.manual_seed(seed)
            model.generate(**kwargs)
    else:
        with overridden(model, "_generate_iterative", counted_iterate), counting(model) as work:
            torch.manual_seed(seed)
            model.generate(**kwargs)
    work.flops = int(flop_mode.get_total_flops())
    return work


def sequence_lengths(model, kwargs: dict, num_step: int = 32) -> tuple:
    """(c_lens, t_lens) of one non-chunked generate, as upstream computes them: the lengths work counts follow."""
    from omnivoice.models.omnivoice import OmniVoiceGenerationConfig

    call = {k: v for k, v in kwargs.items() if k not in ("num_step", "postprocess_output")}
    task = model._preprocess_all(**call)
    cfg = OmniVoiceGenerationConfig(num_step=num_step)
    if task.get_indices(cfg, model.audio_tokenizer.config.frame_rate)[1]:
        raise ValueError("these generate arguments take the chunked path: one sequence length per chunk, not per item")
    c_lens = [
        model._prepare_inference_inputs(task.texts[i], task.target_lens[i], task.ref_texts[i], task.ref_audio_tokens[i],
                                        task.langs[i], task.instructs[i], cfg.denoise)["input_ids"].size(2)
        for i in range(task.batch_size)
    ]
    return c_lens, list(task.target_lens)


def stack_packs(model, point_name: str) -> bool:
    """Whether the lossless stack packs this point's rows on this machine (fastpath.loop.packed_counts), or runs
    stock's layout for want of a row count with stock's bits (then it does stock's arithmetic)."""
    from fastpath import loop
    from harness.model.points import point

    c_lens, t_lens = sequence_lengths(model, point(point_name).generate_kwargs(model, {}))
    return loop.packed_counts(model, c_lens, t_lens, sliced_heads=True) is not None


def batch_vs_each(model, batch_point: str, patches, rounds: int) -> dict:
    """A point's texts as one batch and one call each (`<point>` and `<point>-each`), alternating batch, each,
    batch, each ... on one model with `patches`, after one warm-up each: {"batch": Samples, "each": Samples}.
    The two make the same speech, so RTF(each) / RTF(batch) is the batch's throughput over batch 1."""
    from harness.model.points import point

    prompts: dict = {}
    calls = {"batch": point(batch_point).generate_kwargs(model, prompts),
             "each": point(f"{batch_point}-each").generate_kwargs(model, prompts)}
    samples = {name: Samples(name, tuple(patches)) for name in calls}
    with fastpath.patched(model, list(patches)):
        for r in range(rounds + 1):
            for name, kwargs in calls.items():
                samples[name].add(r, *timed(model, 0, kwargs, {}))
    return samples


def cuda_memory_over_calls(model, kwargs: dict, calls: int) -> dict:
    """Generate `calls` times on CUDA: MiB after each call and the peak during it, allocated and reserved
    ({"allocated", "peak_allocated", "reserved", "peak_reserved"}: a list each). Reserved counts what the caching
    allocator holds, a CUDA graph's private pool included, which allocated alone does not show."""
    device = torch.device(model.device)
    series = {"allocated": [], "peak_allocated": [], "reserved": [], "peak_reserved": []}
    for _ in range(calls):
        torch.cuda.reset_peak_memory_stats(device)
        model.generate(**kwargs)
        synchronize(device)
        for name, read in (("allocated", torch.cuda.memory_allocated), ("peak_allocated", torch.cuda.max_memory_allocated),
                           ("reserved", torch.cuda.memory_reserved), ("peak_reserved", torch.cuda.max_memory_reserved)):
            series[name].append(read(device) / 2**20)
    return series
