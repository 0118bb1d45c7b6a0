"""The GPU tier: speedups that only pay on CUDA, registered in `fastpath.registry` like the CPU patches.

- `cuda_graphs` (graphs.py): the LLM forward captured once per bucketed shape and replayed; sequence length
  padded up a ladder of buckets (shapes.py) with the padded keys masked, captures bounded by an LRU.
- `compiled_llm`, `compiled_llm_reduce_overhead`, `compiled_llm_max_autotune` (compiled.py): `torch.compile`
  of the LLM backbone in one of its modes, inputs bucketed the same way.
- `compiled_vocoder` (compiled.py): `torch.compile` of the audio tokenizer's `decode`.
- `packed_cfg` (packed.py): every row of a step in one forward at its own length, each row attending over its
  own keys with FlexAttention and a document block mask (the loop's packed layout, `fastpath.loop`).
- `cuda_tf32` (flags.py): TF32 matmuls and convolutions, `cudnn.benchmark` off; process-global, so the previous
  values are kept on the model and put back on revert.

None is bit-exact (they change kernels, shapes or precision), so all are registered lossless=False and checked
against stock with tolerances on CUDA (`pytest -m cuda`). On a model that is not on CUDA they apply and stay
inert: every call goes to the stock code, so a CPU model patched with them is bit-exact with stock.
Importing this package imports no torch.
"""


def synchronize(device, api=None, devices: tuple = ("cuda",)) -> None:
    """Wait for the device's queued work: through `api` (default `torch.cuda`) for a device type in `devices`, through
    torch.mps on MPS; nothing to wait for on the CPU. Timers read the clock after this, never before. cuda_graphs
    passes its own API and devices, so a test with a fake CUDA API and devices=("cpu",) runs the CUDA branch."""
    import torch

    device = torch.device(device)
    if device.type in devices:
        (torch.cuda if api is None else api).synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
