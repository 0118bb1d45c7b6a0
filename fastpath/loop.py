"""The fastpath unmasking loop: upstream `OmniVoice._generate_iterative` with three lossless switches.

- `trimmed_cfg`: stock runs the B conditional and B unconditional rows as one batch padded to the longest
  conditional row; here each row runs at its own length (rows of equal length share a batch), so projections,
  MLPs and heads do no work on padding. Only inside attention are queries, keys and values zero-padded back to
  the stock width, behind a mask: the CPU SDPA kernel blocks queries and keys by count, and its reductions
  round differently at other counts (max |diff| 1.5e-7 without the padding); attention is a small share of
  the FLOPs at these lengths. Rows shorter than `MIN_ROWS` are padded to it: CPU GEMMs switch to another
  kernel for very few rows (seen here for M <= 11), which rounds differently.
- `sliced_heads`: the audio heads (hidden -> 8 x 1025 logits) run only on the target positions the sampler
  reads, not on style, text and reference positions.
- `static_prefix`: the input embedding of the static prefix (style, text, reference) is computed once per
  generation; each step re-embeds only the target slice.

Everything else (schedule, scoring, Gumbel position sampling, the order random numbers are drawn in) is
upstream's own code, called through the model, so the random stream and the per-step logits stay the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FEATURES = ("trimmed_cfg", "sliced_heads", "static_prefix")
FLAGS_ATTR = "_fastpath_loop"  # instance attribute: the set of switches that are on
MIN_ROWS = 16  # no GEMM of fewer rows than this: small-M kernels round differently from stock's large batch


@dataclass
class Row:
    item: int  # index into the task
    cond: bool  # conditional (full prompt) or unconditional (target only) row
    start: int  # first target position in this row
    length: int  # number of target positions (t_len)


@dataclass
class Group:
    """One forward batch of rows of one width L: input_ids [G, C, L], audio_mask [G, L], attention_mask
    [G, 1, L, P] with P = L in the stock layout and P = the stock width in the trimmed one."""

    rows: list
    input_ids: torch.Tensor
    audio_mask: torch.Tensor
    attention_mask: torch.Tensor
    embeds: torch.Tensor | None = None  # [G, L, H], static_prefix only


def unmasking_schedules(target_lens, gen_config, num_codebooks):
    """Tokens to unmask per step for each item, as upstream computes them."""
    from omnivoice.models.omnivoice import _get_time_steps

    timesteps = _get_time_steps(
        t_start=0.0, t_end=1.0, num_step=gen_config.num_step, t_shift=gen_config.t_shift
    ).tolist()
    schedules = []
    for t_len in target_lens:
        total = t_len * num_codebooks
        rem, sched = total, []
        for step in range(gen_config.num_step):
            if step == gen_config.num_step - 1:
                num = rem
            else:
                num = min(math.ceil(total * (timesteps[step + 1] - timesteps[step])), rem)
            sched.append(int(num))
            rem -= int(num)
        schedules.append(sched)
    return schedules


def padded_groups(model, inputs_list, c_lens, t_lens):
    """Stock layout: one batch of 2B rows padded to max(c_lens), masks exactly as upstream builds them."""
    B, C, device = len(inputs_list), model.config.num_audio_codebook, model.device
    max_c = max(c_lens)
    ids = torch.full((2 * B, C, max_c), model.config.audio_mask_id, dtype=torch.long, device=device)
    audio_mask = torch.zeros((2 * B, max_c), dtype=torch.bool, device=device)
    attention = torch.zeros((2 * B, 1, max_c, max_c), dtype=torch.bool, device=device)
    rows = [None] * (2 * B)
    for i, inp in enumerate(inputs_list):
        c_len, u_len = c_lens[i], t_lens[i]
        ids[i, :, :c_len] = inp["input_ids"]
        audio_mask[i, :c_len] = inp["audio_mask"]
        attention[i, :, :c_len, :c_len] = True
        ids[B + i, :, :u_len] = inp["input_ids"][..., -u_len:]
        audio_mask[B + i, :u_len] = inp["audio_mask"][..., -u_len:]
        attention[B + i, :, :u_len, :u_len] = True
        if max_c > u_len:
            pad = torch.arange(u_len, max_c, device=device)
            attention[B + i, :, pad, pad] = True
        rows[i] = Row(i, True, c_len - u_len, u_len)
        rows[B + i] = Row(i, False, 0, u_len)
    return [Group(rows, ids, audio_mask, attention)]


def trimmed_groups(model, inputs_list, c_lens, t_lens):
    """Each row at its own length; rows of equal length share a batch (cond rows first).

    The attention mask is [G, 1, L, max_c]: True on the row's own L keys, False on the key padding that
    `padded_key_attention` adds, so every query reduces over as many keys as in the stock batch.
    """
    max_c = max(c_lens)
    C, mask_id = model.config.num_audio_codebook, model.config.audio_mask_id
    by_len: dict = {}
    for i, inp in enumerate(inputs_list):
        u = t_lens[i]
        by_len.setdefault(c_lens[i], []).append((Row(i, True, c_lens[i] - u, u), inp["input_ids"], inp["audio_mask"]))
    for i, inp in enumerate(inputs_list):
        u = t_lens[i]
        by_len.setdefault(u, []).append((Row(i, False, 0, u), inp["input_ids"][..., -u:], inp["audio_mask"][..., -u:]))
    groups = []
    for length, members in by_len.items():
        rows = [m[0] for m in members]
        width = max(length, min(MIN_ROWS, max_c))
        ids = torch.full((len(rows), C, width), mask_id, dtype=torch.long, device=model.device)  # [G, C, L']
        audio_mask = torch.zeros((len(rows), width), dtype=torch.bool, device=model.device)  # [G, L']
        for g, (_, row_ids, row_mask) in enumerate(members):
            ids[g, :, :length] = row_ids[0]
            audio_mask[g, :length] = row_mask[0]
        attention = torch.zeros((len(rows), 1, width, max_c), dtype=torch.bool, device=model.device)
        attention[:, :, :length, :length] = True
        groups.append(Group(rows, ids, audio_mask, attention))
    return groups


def group_logits(model, group: Group, flags):
    """Per row of the group, the float32 logits at its target positions: list of [1, C, t_len, V]."""
    if not ({"sliced_heads", "static_prefix"} & flags):
        logits = model(
            input_ids=group.input_ids, audio_mask=group.audio_mask, attention_mask=group.attention_mask
        ).logits.to(torch.float32)  # [G, C, L, V]
        return [logits[g : g + 1, :, r.start : r.start + r.length, :] for g, r in enumerate(group.rows)]

    if "static_prefix" in flags:
        if group.embeds is None:
            group.embeds = model._prepare_embed_inputs(group.input_ids, group.audio_mask).clone()
        else:
            for g, r in enumerate(group.rows):
                span = slice(r.start, r.start + r.length)
                group.embeds[g : g + 1, span] = model._prepare_embed_inputs(
                    group.input_ids[g : g + 1, :, span], group.audio_mask[g : g + 1, span]
                )
        embeds = group.embeds
    else:
        embeds = model._prepare_embed_inputs(group.input_ids, group.audio_mask)

    # as upstream OmniVoice.forward, minus the heads
    hidden = model.llm(inputs_embeds=embeds, attention_mask=group.attention_mask, return_dict=True, position_ids=None)[0]
    C, V = model.config.num_audio_codebook, model.config.audio_vocab_size
    out = []
    for g, r in enumerate(group.rows):
        if "sliced_heads" in flags:
            stop = min(hidden.size(1), r.start + max(r.length, MIN_ROWS))  # at least MIN_ROWS rows per GEMM
            start = max(0, stop - max(r.length, MIN_ROWS))
            flat = model.audio_heads(hidden[g : g + 1, start:stop])  # [1, n >= t_len, C * V]
            part = flat.view(1, stop - start, C, V).permute(0, 2, 1, 3).to(torch.float32)
            out.append(part[:, :, r.start - start : r.start - start + r.length, :])
        else:
            flat = model.audio_heads(hidden[g : g + 1])  # [1, L, C * V]
            full = flat.view(1, flat.size(1), C, V).permute(0, 2, 1, 3).to(torch.float32)
            out.append(full[:, :, r.start : r.start + r.length, :])
    return out


def generate_iterative(model, task, gen_config):
    """Drop-in for `OmniVoice._generate_iterative(task, gen_config)`; returns a list of [C, t_len] tokens."""
    from omnivoice.models.omnivoice import _gumbel_sample

    flags = model.__dict__.get(FLAGS_ATTR, set())
    B, C, mask_id = task.batch_size, model.config.num_audio_codebook, model.config.audio_mask_id
    inputs_list = [
        model._prepare_inference_inputs(
            task.texts[i], task.target_lens[i], task.ref_texts[i], task.ref_audio_tokens[i],
            task.langs[i], task.instructs[i], gen_config.denoise,
        )
        for i in range(B)
    ]
    c_lens = [inp["input_ids"].size(2) for inp in inputs_list]
    t_lens = list(task.target_lens)
    build = trimmed_groups if "trimmed_cfg" in flags else padded_groups
    groups = build(model, inputs_list, c_lens, t_lens)

    tokens = torch.full((B, C, max(t_lens)), mask_id, dtype=torch.long, device=model.device)
    schedules = unmasking_schedules(t_lens, gen_config, C)
    layer_ids = torch.arange(C, device=model.device).view(1, -1, 1)

    for step in range(gen_config.num_step):
        cond, uncond = [None] * B, [None] * B
        for group in groups:
            for row, logits in zip(group.rows, group_logits(model, group, flags)):
                (cond if row.cond else uncond)[row.item] = logits

        for i in range(B):  # upstream's per-item scoring, same order of random draws
            k = schedules[i][step]
            if k <= 0:
                continue
            t_len = t_lens[i]
            pred_tokens, scores = model._predict_tokens_with_scoring(cond[i], uncond[i], gen_config)
            scores = scores - (layer_ids * gen_config.layer_penalty_factor)
            if gen_config.position_temperature > 0.0:
                scores = _gumbel_sample(scores, gen_config.position_temperature)
            sample_tokens = tokens[i : i + 1, :, :t_len]
            scores.masked_fill_(sample_tokens != mask_id, -float("inf"))
            _, topk_idx = torch.topk(scores.flatten(), k)
            flat_tokens = sample_tokens.flatten()
            flat_tokens[topk_idx] = pred_tokens.flatten()[topk_idx]
            sample_tokens.copy_(flat_tokens.view_as(sample_tokens))
            tokens[i : i + 1, :, :t_len] = sample_tokens

        for group in groups:  # write the new tokens into every row of every item
            for g, row in enumerate(group.rows):
                group.input_ids[g : g + 1, :, row.start : row.start + row.length] = tokens[row.item : row.item + 1, :, :row.length]

    return [tokens[i, :, : t_lens[i]] for i in range(B)]


PADDED_ATTENTION = "fastpath_padded_keys|"  # + the implementation it wraps, e.g. "fastpath_padded_keys|sdpa"


def padded_key_attention(inner: str):
    """An attention function that zero-pads keys/values up to the mask's width, then calls `inner`."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def attention(module, query, key, value, attention_mask, **kwargs):
        # query: [G, heads, L, d]; key/value: [G, kv_heads, L, d]; attention_mask: [G, 1, L, P], P >= L
        L = query.size(2)
        pad = 0 if attention_mask is None or attention_mask.dim() != 4 else attention_mask.size(-1) - L
        if pad <= 0:
            return ALL_ATTENTION_FUNCTIONS[inner](module, query, key, value, attention_mask, **kwargs)
        pad_seq = (0, 0, 0, pad)  # zero rows appended along the sequence dim
        query, key, value = (torch.nn.functional.pad(t, pad_seq) for t in (query, key, value))
        attention_mask = torch.nn.functional.pad(attention_mask, (0, 0, 0, pad), value=False)  # [G, 1, P, P]
        out, weights = ALL_ATTENTION_FUNCTIONS[inner](module, query, key, value, attention_mask, **kwargs)
        return out[:, :L], weights  # out: [G, P, heads, d] -> the real query rows

    return attention


def install_padded_key_attention(model) -> None:
    """Point this model's LLM at the padding wrapper of its current attention implementation."""
    from transformers import AttentionInterface

    current = model.llm.config._attn_implementation
    if current.startswith(PADDED_ATTENTION):
        return
    name = PADDED_ATTENTION + current
    AttentionInterface.register(name, padded_key_attention(current))  # adds a name; changes no existing one
    model.llm.set_attn_implementation(name)


def remove_padded_key_attention(model) -> None:
    current = model.llm.config._attn_implementation
    if current.startswith(PADDED_ATTENTION):
        model.llm.set_attn_implementation(current[len(PADDED_ATTENTION):])
