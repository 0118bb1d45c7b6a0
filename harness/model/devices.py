"""Hardware checks by name, and models loaded once per (checkpoint, device, dtype), for the GPU tier's tests.

The root conftest skips every `cuda`-marked test where `torch.cuda.is_available()` is False and says why; the
checks here are for finer conditions inside that tier (bf16 needs compute capability 8.0).
"""

from __future__ import annotations

from harness.model.checkpoint import load_model

DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def cuda_capability() -> tuple | None:
    import torch

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def bf16_supported() -> bool:
    capability = cuda_capability()
    return capability is not None and capability >= (8, 0)


def skip_unless_dtype_supported(dtype: str) -> None:
    import pytest

    if dtype == "bf16" and not bf16_supported():
        pytest.skip(f"bf16 needs compute capability >= 8.0; this GPU has {cuda_capability()}")


def torch_dtype(name: str):
    import torch

    return getattr(torch, DTYPE_NAMES[name])


class ModelCache:
    """`get(checkpoint, device, dtype)` loads once and keeps the model; every user must leave it unpatched."""

    def __init__(self):
        self.models: dict = {}

    def get(self, checkpoint, device: str = "cuda", dtype: str = "fp32"):
        import fastpath

        key = (str(checkpoint.path), device, dtype)
        if key not in self.models:
            self.models[key] = load_model(checkpoint, device=device, dtype=torch_dtype(dtype))
        model = self.models[key]
        assert fastpath.applied(model) == [], f"a test left {fastpath.applied(model)} applied on a shared model"
        return model

    def fresh(self, checkpoint, device: str = "cuda", dtype: str = "fp32"):
        """A model of its own (for first-call latency, compile time, memory), not cached."""
        return load_model(checkpoint, device=device, dtype=torch_dtype(dtype))

    def clear(self) -> None:
        self.models.clear()


def llm_inputs(model, G=2, L=37, P=None, seed=0):
    """Stock-layout LLM inputs of the tiny model: random embeddings, a bidirectional mask over L (of P) keys."""
    import torch

    g = torch.Generator().manual_seed(seed)
    P = P or L
    embeds = torch.randn(G, L, model.config.llm_config.hidden_size, generator=g)
    mask = torch.zeros(G, 1, L, P, dtype=torch.bool)
    mask[:, :, :, :L] = True
    mask[1, :, :, L - 7:] = False  # second row: 7 padding positions, as stock pads its unconditional rows
    mask[1, :, torch.arange(L - 7, L), torch.arange(L - 7, L)] = True
    return dict(inputs_embeds=embeds, attention_mask=mask, return_dict=True, position_ids=None)
