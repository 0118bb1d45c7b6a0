"""The test checkpoint's codec: calibrated when the checkpoint is built, so that it carries information, and measured.

A `HiggsAudioV2TokenizerModel` straight from its initialisation hears and says nothing: its quantizer codebooks
start at zeros (training fills them), so every frame encodes to entry 0 and every code decodes to one vector; and
the DAC layers' small initial weights shrink the signal layer by layer, so the decoder's output is its biases'
pattern whatever the codes. Every check downstream that compares audio, or a voice, would compare nothing.

`calibrate` fixes both, on seeded synthetic audio (`calibration_audio`), in float64 so that every machine rounds
the result to the same float32 weights (a float32 calibration would differ in its last bits between instruction
sets, and with it the weights and their digests):
- `scale_layers` (LSUV, Mishkin & Matas 2016) on the encoder, then on the decoder: each linear or convolution layer
  rescaled, in execution order, to unit output standard deviation; the decoder's last layer to the recipe's
  `output_rms`, a speech level;
- `fill_codebooks`: each residual stage's 1024 entries drawn from a Gaussian fitted to the vectors that stage
  quantizes (a data-dependent codebook initialisation, as a codec's k-means initialisation is), so that codes
  spread over the codebook and every stage's choice moves the decoded audio.

`measure` says what the codec carries on any checkpoint (the built ones or a real one): per codebook, how many
distinct entries each reference clip uses and how often two different clips agree frame by frame; how far apart
the decodes of different codes are; how much one code changed at one frame moves the audio near that frame, and
how far from it anything moves. tests_harness/test_codec.py holds the bounds.

    fastpath-suite maintain checkpoint [--size tiny|full] [--checkpoint PATH] [--results results/]
"""

from __future__ import annotations

# the measuring points: a [1, 8, FRAMES] code tensor, one code changed at frame FRAME
FRAMES, FRAME, SEED = 40, 20, 0
HOP = 960  # samples per frame at 24 kHz, 25 frames/s


def calibration_audio(seed: int, clips: int, seconds: float, rate: int = 24000):
    """Seeded test signals, float64 [clips, 1, samples] at RMS 0.1: a voiced-like harmonic series (f0 80-300 Hz,
    vibrato, a syllable-rate envelope) over noise of a random level. Not speech: varied enough that every layer and
    every codebook dimension sees a spread of values."""
    import math

    import torch

    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(rate * seconds), dtype=torch.float64) / rate

    def uniform(low, high):
        return low + (high - low) * torch.rand((), generator=g, dtype=torch.float64)

    out = []
    for _ in range(clips):
        f0, vibrato = uniform(80, 300), 1 + 0.05 * torch.sin(2 * math.pi * uniform(2, 7) * t)
        voiced = sum(uniform(0, 1) / k * torch.sin(2 * math.pi * f0 * k * t * vibrato) for k in range(1, 9))
        envelope = 0.5 + 0.5 * torch.sin(2 * math.pi * uniform(1, 5) * t + uniform(0, 2 * math.pi))
        noise = uniform(0.02, 0.4) * torch.randn(t.shape, generator=g, dtype=torch.float64)
        x = voiced * envelope + noise
        out.append(0.1 * x / x.pow(2).mean().sqrt())
    return torch.stack(out)[:, None, :]


def scale_layers(root, run, last=None, last_std: float = 1.0, keep=None):
    """LSUV: during one call of `run()`, every nn.Linear / Conv1d / ConvTranspose1d under `root` has its weight
    rescaled so that the weight's term of its output (output minus bias) has standard deviation 1 (`last`:
    `last_std`), in execution order, each layer seeing its inputs already rescaled. Returns the rescaled output of
    the layer `keep` (None without one)."""
    import torch
    from torch import nn

    kept = {}

    def rescale(layer, target):
        def hook(module, args, out):
            bias = 0.0 if module.bias is None else (
                module.bias if isinstance(module, nn.Linear) else module.bias.view(1, -1, 1))
            scale = target / (out - bias).std()  # the weight's term; the bias stays as initialised
            module.weight.mul_(scale)
            out = (out - bias) * scale + bias
            if module is keep:
                kept["out"] = out
            return out

        return layer.register_forward_hook(hook)

    layers = [m for m in root.modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.ConvTranspose1d))]
    hooks = [rescale(m, last_std if m is last else 1.0) for m in layers]
    try:
        with torch.no_grad():
            run()
    finally:
        for h in hooks:
            h.remove()
    return kept.get("out")


def fill_codebooks(tokenizer, embeddings, seed: int):
    """Stage by stage, the codebook of residual quantizer k gets 1024 entries drawn from N(mean, cov) of the
    vectors it quantizes (`project_in` of the residual the stages before it leave, starting from `embeddings`
    [B, T, H], the output of the tokenizer's `fc`); the EMA state (cluster_size, embed_avg) as a codebook with one
    use of each entry. Returns the codes of those embeddings [B, C, T], as the quantizer's encode gives them."""
    import torch

    with torch.no_grad():
        residual = embeddings.transpose(1, 2)  # [B, H, T], as HiggsAudioV2TokenizerModel.encode passes it on
        g = torch.Generator().manual_seed(seed)
        codes = []
        for stage in tokenizer.quantizer.quantizers:
            book = stage.codebook
            vectors = stage.project_in(residual.transpose(1, 2)).reshape(-1, book.embed.shape[1])  # [B*T, D]
            cov = torch.cov(vectors.T)
            cov += 1e-6 * cov.diagonal().mean() * torch.eye(cov.shape[0], dtype=cov.dtype)
            z = torch.randn(book.embed.shape, generator=g, dtype=torch.float64)  # [1024, D]
            entries = vectors.mean(0) + z.to(vectors.dtype) @ torch.linalg.cholesky(cov).T
            book.embed.copy_(entries)
            book.embed_avg.copy_(entries)
            book.cluster_size.fill_(1.0)
            codes.append(stage.encode(residual))  # [B, T]
            residual = residual - stage.decode(codes[-1])
        return torch.stack(codes, dim=1)


def calibrate(tokenizer, codec: dict) -> None:
    """Make a freshly initialised HiggsAudioV2TokenizerModel carry information (module docstring): encoder scaled,
    codebooks filled, decoder scaled, on `calibration_audio` in float64, then back to float32; one encode and one
    decode of that audio in all. `codec`: the recipe's codec section (seed, clips, seconds, output_rms)."""
    import torch

    audio = calibration_audio(codec["seed"], codec["clips"], codec["seconds"])
    tokenizer.double()
    try:
        embeddings = scale_layers(
            torch.nn.ModuleList([tokenizer.acoustic_encoder, tokenizer.encoder_semantic, tokenizer.fc]),
            lambda: tokenizer.encode(audio), keep=tokenizer.fc)
        codes = fill_codebooks(tokenizer, embeddings, codec["seed"])
        decoder = tokenizer.acoustic_decoder
        scale_layers(torch.nn.ModuleList([tokenizer.fc2, decoder]), lambda: tokenizer.decode(codes),
                     last=decoder.conv2, last_std=codec["output_rms"])
    finally:
        tokenizer.float()


# --- what the codec carries ------------------------------------------------------------------------------------

def clips(rate: int) -> dict:
    """The clips the encoder is measured on, float32 [samples] at `rate`: the two reference recordings, the 3 s one
    reversed (same length and spectrum, other content) and seeded white noise of its length."""
    import numpy as np
    import soundfile as sf
    import torchaudio

    from harness.model.points import reference

    out = {}
    for name in ("ref_3s", "ref_6s"):
        audio, sr = sf.read(reference(name)[0], dtype="float32")
        if sr != rate:
            import torch

            audio = torchaudio.functional.resample(torch.from_numpy(audio), sr, rate).numpy()
        out[name] = audio
    out["ref_3s reversed"] = out["ref_3s"][::-1].copy()
    out["white noise"] = (np.random.default_rng(SEED).standard_normal(out["ref_3s"].size) * 0.1).astype(np.float32)
    return out


def encode(tokenizer, audio) -> "torch.Tensor":
    """Codes [C, T] of float32 audio [samples] (cut to whole frames, as create_voice_clone_prompt cuts it)."""
    import torch

    hop = tokenizer.config.hop_length
    audio = audio[: audio.size // hop * hop]
    with torch.inference_mode():
        return tokenizer.encode(torch.from_numpy(audio).to(tokenizer.device)[None, None]).audio_codes[0].cpu()


def decode(tokenizer, codes) -> "torch.Tensor":
    """Audio [samples] of codes [C, T] (float32, on the CPU)."""
    import torch

    with torch.inference_mode():
        return tokenizer.decode(codes[None].to(tokenizer.device)).audio_values[0, 0].float().cpu()


def measure(model) -> dict:
    """What the model's codec carries (module docstring), as plain numbers."""
    import itertools

    import torch

    tokenizer = model.audio_tokenizer
    hop = tokenizer.config.hop_length
    codes = {name: encode(tokenizer, audio) for name, audio in clips(model.sampling_rate).items()}
    books = next(iter(codes.values())).shape[0]
    distinct = {name: [int(c[k].unique().numel()) for k in range(books)] for name, c in codes.items()}
    agreement = {}
    for a, b in itertools.combinations(codes, 2):
        n = min(codes[a].shape[1], codes[b].shape[1])
        agreement[f"{a} / {b}"] = [float((codes[a][k, :n] == codes[b][k, :n]).float().mean()) for k in range(books)]

    g = torch.Generator().manual_seed(SEED)
    size = tokenizer.config.codebook_size
    random_codes = [torch.randint(0, size, (books, FRAMES), generator=g) for _ in range(3)]
    audios = [decode(tokenizer, c) for c in random_codes]
    rms = [float(a.pow(2).mean().sqrt()) for a in audios]
    apart = min(float((x - y).abs().max()) for x, y in itertools.combinations(audios, 2))
    base, window = audios[0], slice((FRAME - 1) * hop, (FRAME + 2) * hop)  # the frame and one on each side
    per_codebook = []
    for k in range(books):
        changed = random_codes[0].clone()
        changed[k, FRAME] = (changed[k, FRAME] + 1) % size
        moved = (decode(tokenizer, changed) - base).abs()
        where = moved.nonzero().flatten()
        reach = int(max(abs(int(where.min()) // hop - FRAME), abs(int(where.max()) // hop - FRAME))) if where.numel() \
            else None
        per_codebook.append({"near": float(moved[window].max()), "reach_frames": reach})
    return {"frames": {name: int(c.shape[1]) for name, c in codes.items()}, "distinct": distinct,
            "agreement": agreement, "decode_rms": rms, "decodes_apart": apart, "one_code": per_codebook,
            "codebook_size": size}


def describe(figures: dict) -> str:
    lines = ["Encoding: distinct codebook entries used per clip (of its frames), per codebook:"]
    for name, counts in figures["distinct"].items():
        lines.append(f"  {name:16s} {figures['frames'][name]:4d} frames: {' '.join(f'{c:4d}' for c in counts)}")
    lines.append("Frame-by-frame agreement of two clips' codes, per codebook:")
    for pair, shares in figures["agreement"].items():
        lines.append(f"  {pair:34s} {' '.join(f'{s:.3f}' for s in shares)}")
    lines.append(f"Decoding: 3 random code tensors [{len(figures['one_code'])}, {FRAMES}]: RMS "
                 f"{', '.join(f'{r:.3f}' for r in figures['decode_rms'])}; closest pair apart by max |diff| "
                 f"{figures['decodes_apart']:.3g}")
    lines.append(f"One code changed at frame {FRAME}, per codebook: max |diff| within a frame of it, farthest frame "
                 f"moved:")
    lines += [f"  codebook {k}: {c['near']:.3g}, {c['reach_frames']} frames away"
              for k, c in enumerate(figures["one_code"])]
    return "\n".join(lines)


def render_results(figures: dict) -> str:
    """Markdown for docs/results.md (results kind "codec"): {checkpoint kind: measure() figures}."""
    out = []
    for kind, f in figures.items():
        books = len(f["one_code"])
        head = "| | " + " | ".join(f"cb {k}" for k in range(books)) + " |"
        rule = "| --- |" + " ---: |" * books
        out += [f"**{kind}** (`{f['checkpoint']}`). Distinct entries (of {f['codebook_size']}) each clip's codes use, "
                "per codebook (clip length in frames):", "", head, rule]
        out += [f"| {name} ({f['frames'][name]}) | " + " | ".join(map(str, counts)) + " |"
                for name, counts in f["distinct"].items()]
        out += ["", "Share of frames where two clips have the same code, per codebook:", "", head, rule]
        out += [f"| {pair} | " + " | ".join(f"{s:.3f}" for s in shares) + " |" for pair, shares in f["agreement"].items()]
        out += ["", f"Decoding three random code tensors [{books}, {FRAMES}]: RMS "
                f"{', '.join(f'{r:.3f}' for r in f['decode_rms'])}, the closest two apart by max \\|diff\\| "
                f"{f['decodes_apart']:.3g}. One code changed at frame {FRAME}:", "",
                "| codebook | max \\|diff\\| within a frame of it | farthest frame moved |", "| --- | ---: | ---: |"]
        out += [f"| {k} | {c['near']:.3g} | {c['reach_frames']} |" for k, c in enumerate(f["one_code"])]
        out.append("")
    return "\n".join(out)
