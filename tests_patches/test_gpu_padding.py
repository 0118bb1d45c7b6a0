"""Padding an LLM call to a bucket (fastpath/gpu/padding.py): real rows unchanged, padding isolated."""

from __future__ import annotations

import pytest
import torch

import fastpath
from fastpath.gpu.padding import fill_padded, llm_call_shape, padded
from harness.parity import tolerance
from harness.model.devices import llm_inputs

# --- padding ---------------------------------------------------------------------------------------------------------


def call(G=2, L=5, P=None, H=8, **extra):
    P = P or L
    mask = torch.zeros(G, 1, L, P, dtype=torch.bool)
    mask[:, :, :, :L] = True
    return dict(inputs_embeds=torch.randn(G, L, H), attention_mask=mask, return_dict=True, position_ids=None, **extra)


def test_llm_call_shape_takes_only_what_padding_handles():
    assert llm_call_shape((), call()) == (2, 5, 5)
    assert llm_call_shape((), call(P=9)) == (2, 5, 9)
    assert llm_call_shape((), call(use_cache=False)) == (2, 5, 5)
    refused = [
        ((torch.zeros(1),), call()),  # positional
        ((), call(output_attentions=True)),  # unknown keyword
        ((), call(use_cache=True)),  # a KV cache is asked for
        ((), {**call(), "position_ids": torch.arange(5)[None]}),
        ((), {**call(), "return_dict": False}),
        ((), {**call(), "attention_mask": call()["attention_mask"].float()}),  # additive float mask
        ((), {**call(), "attention_mask": torch.ones(2, 5, dtype=torch.bool)}),  # 2D padding mask
        ((), {**call(), "attention_mask": torch.ones(2, 1, 5, 4, dtype=torch.bool)}),  # fewer keys than queries
        ((), {**call(), "inputs_embeds": None}),
    ]
    for args, kwargs in refused:
        assert llm_call_shape(args, kwargs) is None, sorted(kwargs)


def test_fill_padded_keeps_real_rows_and_isolates_padding():
    torch.manual_seed(0)
    c = call(G=2, L=5, P=7)
    c["attention_mask"][1, :, :, 3:] = False  # a row with fewer real keys
    embeds, mask = padded(c["inputs_embeds"], c["attention_mask"], length=8, keys=10)
    assert embeds.shape == (2, 8, 8) and mask.shape == (2, 1, 8, 10)
    assert torch.equal(embeds[:, :5], c["inputs_embeds"]) and not embeds[:, 5:].any()
    assert torch.equal(mask[:, :, :5, :7], c["attention_mask"])
    assert not mask[:, :, :5, 7:].any(), "real rows must not see padded keys"
    for r in range(5, 8):  # padded rows: themselves only
        expected = torch.zeros(10, dtype=torch.bool)
        expected[r] = True
        assert torch.equal(mask[0, 0, r], expected) and torch.equal(mask[1, 0, r], expected)
    with pytest.raises(ValueError, match="cannot hold"):
        fill_padded(c["inputs_embeds"], c["attention_mask"], torch.empty(2, 4, 8),
                    torch.empty(2, 1, 4, 10, dtype=torch.bool))


@pytest.mark.cpu
@pytest.mark.parametrize("P, length, keys", [(None, 64, 64), (None, 128, 128), (100, 64, 128)],
                         ids=["one-bucket", "two-buckets", "trimmed-layout"])
def test_padded_forward_computes_the_same_real_rows(model, P, length, keys):
    """Padding is the same function (fp32 CPU, other shapes: equal to rounding, not bit-exact). The trimmed
    layout (mask wider than the sequence) runs under trimmed_cfg's padded-key attention, as in the loop."""
    kwargs = llm_inputs(model, P=P)
    with fastpath.patched(model, ["trimmed_cfg"] if P else []), torch.inference_mode():
        ref = model.llm(**kwargs)[0]
        embeds, mask = padded(kwargs["inputs_embeds"], kwargs["attention_mask"], length, keys)
        out = model.llm(inputs_embeds=embeds, attention_mask=mask, return_dict=True, position_ids=None)[0]
    assert torch.isfinite(out).all(), "a padded row produced NaN/inf"
    err = tolerance.relative_error(out[:, :37], ref)
    assert err < 1e-5, f"padded forward rel err {err:.2e}"
