"""Hardware checks by name, and models loaded once per (checkpoint, device, dtype), for the GPU tier's tests.

`cuda_problem()` says why CUDA is not usable here (the wheel, the driver, a device): the root conftest fails a run that
asks for the `cuda` tests with it in strict mode, and leaves the `cuda` tests out of a run that does not ask for them.
The other checks are for finer conditions inside that tier (bf16 needs compute capability 8.0).
"""

from __future__ import annotations

from harness.model.checkpoint import load_model

DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


CUDA_INSTALL = ("install torch's CUDA build for this runner's driver: FASTPATH_CONSTRAINTS=constraints-cuda.txt bash "
                "scripts/install.sh (docs/gpu.md, 'Installing on a GPU runner')")


def cuda_problem() -> str | None:
    """Why CUDA is not usable here, naming what is missing (the wheel, the driver, a device) and the fix; None when
    `torch.cuda.is_available()`. Initialises CUDA only to read the driver's own error, where it is not available."""
    import os
    import shutil

    import torch

    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return f"the wheel: torch {torch.__version__} is a CPU build (torch.version.cuda is None); {CUDA_INSTALL}"
    try:
        torch.cuda.init()
    except Exception as err:  # noqa: BLE001 - the driver's own words are the diagnosis
        said = str(err).splitlines()[0]
    else:
        said = "torch.cuda.init() raised nothing"
    smi = shutil.which("nvidia-smi")
    if "driver" in said.lower() or smi is None:
        return (f"the driver: torch {torch.__version__} (CUDA {torch.version.cuda}) cannot reach an NVIDIA driver "
                f"({'nvidia-smi not found' if smi is None else 'nvidia-smi at ' + smi}; torch says: {said}); a "
                f"CUDA {torch.version.cuda} build needs a driver that supports it (nvidia-smi's 'CUDA Version' at or "
                f"above {torch.version.cuda}), or {CUDA_INSTALL}")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (f"a device: the driver answers but torch sees {torch.cuda.device_count()} CUDA device(s) "
            f"(CUDA_VISIBLE_DEVICES={visible!r}; torch says: {said}); give the job a GPU")


def asks_for_cuda(markexpr: str, items, markers) -> bool:
    """Whether the run asks for the `cuda` tests: its -m expression selects a test because it is marked `cuda` (true
    for some set of other marks with `cuda` added and false without it: `-m cuda`, `-m "slow and cuda"`, `-m "cuda or
    slow"`; not `-m "not cuda"`), or every test it selected is one. markers: the mark names the suite registers."""
    from itertools import combinations

    from _pytest.mark.expression import Expression

    if items and all("cuda" in item.keywords for item in items):
        return True
    if not markexpr.strip():
        return False
    expr, others = Expression.compile(markexpr), sorted(set(markers) - {"cuda"})
    return any(not expr.evaluate(lambda m, **_: m in marks) and expr.evaluate(lambda m, **_: m in marks | {"cuda"})
               for k in range(len(others) + 1) for marks in map(set, combinations(others, k)))


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


def main(argv=None) -> int:
    """`fastpath-suite cuda-check`: a GPU runner's first check. Prints torch's version, its CUDA build and the device
    (name, compute capability, driver); exit 0 when CUDA is usable, else 1 naming what is missing."""
    import torch

    import argparse

    argparse.ArgumentParser(prog="fastpath-suite cuda-check", description=main.__doc__.split(". ")[1]).parse_args(argv)
    print(f"torch {torch.__version__} | CUDA build {torch.version.cuda}")
    problem = cuda_problem()
    if problem is not None:
        print(f"CUDA is not usable: {problem}")
        return 1
    from harness.run.machine import device_key, machine_info

    info = machine_info("cuda")
    print(f"device {info['gpu_name']} | compute capability {info.get('compute_capability')} | driver "
          f"{info.get('gpu_driver')} | {torch.cuda.device_count()} visible")
    print(f"device key {device_key(info)} (its speed baseline: baselines/{device_key(info)}.json)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
