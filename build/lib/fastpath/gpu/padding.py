"""Padding one LLM call up to a bucketed shape without changing what its real rows compute.

OmniVoice calls its LLM as `llm(inputs_embeds=[G, L, H], attention_mask=[G, 1, L, P] bool, return_dict=True,
position_ids=None)`: stock with P = L, the trimmed-CFG loop with P = the stock width >= L. The padded call has
[G, Lb, H] embeddings (zeros past L) and a [G, 1, Lb, Pb] mask (Lb >= L, Pb >= max(P, Lb)):

- real rows keep their mask and see False on every padded key, so softmax gives the padded keys weight 0 and
  the real rows' arithmetic is the same function (kernels may round differently at other shapes);
- each padded row attends to itself only, as stock already does for its own padding rows: a row with no key
  would give NaN, and NaN values times weight 0 would still poison the real rows in the next layer;
- positions stay 0..L-1 for the real rows (position_ids None -> arange of the padded length).
"""

from __future__ import annotations

import torch

# keyword arguments an LLM call may carry and still be padded; anything else goes to the stock forward
HANDLED_KWARGS = {"inputs_embeds", "attention_mask", "position_ids", "return_dict", "use_cache"}


def llm_call_shape(args: tuple, kwargs: dict):
    """(G, L, P) for a call the GPU paths can pad and replay, else None (then it runs as is).

    Handled: keyword-only; inputs_embeds a floating [G, L, H] tensor; attention_mask a bool [G, 1, L, P] tensor
    on the same device with P >= L; position_ids None; return_dict None or True; use_cache None or False
    (the caller gets the last hidden state and no KV cache, which OmniVoice never reads).
    """
    if args or not set(kwargs) <= HANDLED_KWARGS:
        return None
    embeds, mask = kwargs.get("inputs_embeds"), kwargs.get("attention_mask")
    if not (isinstance(embeds, torch.Tensor) and isinstance(mask, torch.Tensor)):
        return None
    if kwargs.get("position_ids") is not None or kwargs.get("return_dict") is False or kwargs.get("use_cache"):
        return None
    if embeds.dim() != 3 or not embeds.is_floating_point() or mask.dim() != 4 or mask.dtype != torch.bool:
        return None
    G, L = embeds.shape[0], embeds.shape[1]
    if tuple(mask.shape[:3]) != (G, 1, L) or mask.shape[3] < L or mask.device != embeds.device:
        return None
    return G, L, mask.shape[3]


def fill_padded(embeds: torch.Tensor, mask: torch.Tensor, out_embeds: torch.Tensor, out_mask: torch.Tensor) -> None:
    """Write one call's inputs into padded buffers, in place (the static inputs of a captured graph).

    embeds: [G, L, H] -> out_embeds [G, Lb, H]; mask: [G, 1, L, P] -> out_mask [G, 1, Lb, Pb], Pb >= max(P, Lb).
    """
    G, L = embeds.shape[:2]
    P, Lb, Pb = mask.shape[-1], out_embeds.shape[1], out_mask.shape[-1]
    if out_embeds.shape[0] != G or out_mask.shape[0] != G or Lb < L or out_mask.shape[2] != Lb or Pb < max(P, Lb):
        raise ValueError(f"padded buffers {tuple(out_embeds.shape)}, {tuple(out_mask.shape)} cannot hold "
                         f"inputs {tuple(embeds.shape)}, {tuple(mask.shape)}")
    out_embeds[:, :L].copy_(embeds)
    out_embeds[:, L:].zero_()
    out_mask.zero_()
    out_mask[:, :, :L, :P].copy_(mask)
    if Lb > L:
        pad = torch.arange(L, Lb, device=out_mask.device)
        out_mask[:, :, pad, pad] = True  # each padded row attends to itself only


def padded(embeds: torch.Tensor, mask: torch.Tensor, length: int, keys: int) -> tuple:
    """New padded copies: ([G, length, H] embeddings, [G, 1, length, keys] mask)."""
    G, _, H = embeds.shape
    out_embeds = torch.empty((G, length, H), dtype=embeds.dtype, device=embeds.device)
    out_mask = torch.empty((G, 1, length, keys), dtype=torch.bool, device=mask.device)
    fill_padded(embeds, mask, out_embeds, out_mask)
    return out_embeds, out_mask


def hidden_output(hidden: torch.Tensor, length: int):
    """What the LLM returns, for the real rows: a fresh copy of hidden[:, :length] (the buffer is reused)."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    return BaseModelOutputWithPast(last_hidden_state=hidden[:, :length].clone())
