"""Test checkpoints: a real OmniVoice checkpoint folder built through the real classes, or the user's own.

No model hub is reachable here, so the suite builds its own checkpoint: `OmniVoiceConfig` with a Qwen3
`llm_config`, a `HiggsAudioV2TokenizerModel` at 25 frames/s with 8 codebooks, and a byte-level BPE text
tokenizer that holds OmniVoice's special tokens, all with seeded random weights. It is saved as a checkpoint
folder and loaded only through `OmniVoice.from_pretrained`, so the real loading code runs.

The codec is then calibrated (`harness.model.codec.calibrate`): initialised alone, it hears and says nothing (zero
codebooks, a decoder that speaks its biases), and every check that compares audio would compare nothing.

Stages: `build_checkpoint` (cached by `checkpoint_key`) -> `resolve_checkpoint` (user's path, HF cache, or
built) -> `load_model`.

    fastpath-suite maintain checkpoint [--size tiny|full] [--checkpoint PATH] [--results results/]

builds the test checkpoint if it is not cached, says where it is, and what its codec carries (harness.model.codec.measure).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness import REPO_ROOT
from harness.run.machine import started_threads

RECIPE_FILE = REPO_ROOT / "fixtures" / "checkpoint" / "recipe.json"
TOKENIZER_CORPUS = REPO_ROOT / "fixtures" / "checkpoint" / "tokenizer_corpus.txt"
ENV_CHECKPOINT = "FASTPATH_CHECKPOINT"
HF_REPO_ID = "k2-fsa/OmniVoice"

# OmniVoice's control tokens (see omnivoice.models.omnivoice._prepare_inference_inputs) and the
# non-verbal tags it tokenises standalone (_NONVERBAL_PATTERN).
SPECIAL_TOKENS = [
    "<|denoise|>",
    "<|lang_start|>",
    "<|lang_end|>",
    "<|instruct_start|>",
    "<|instruct_end|>",
    "<|text_start|>",
    "<|text_end|>",
]
NONVERBAL_TAGS = [
    "[laughter]", "[sigh]", "[confirmation-en]", "[question-en]", "[question-ah]", "[question-oh]",
    "[question-ei]", "[question-yi]", "[surprise-ah]", "[surprise-oh]", "[surprise-wa]", "[surprise-yo]",
    "[dissatisfaction-hnn]",
]
AUDIO_MASK_ID = 1024  # OmniVoiceConfig default; the text vocabulary must reach past it


class CheckpointError(RuntimeError):
    """A checkpoint could not be found, built or loaded; the message names the fix."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    kind: str  # "tiny" | "full" (built here) or "real" (user's weights)

    @property
    def is_real(self) -> bool:
        return self.kind == "real"

    @property
    def identity(self) -> str:
        """Short stable name for cache keys and reports."""
        if self.kind == "real":
            digest = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:12]
            return f"real-{digest}"
        return self.path.name


def load_recipes() -> dict:
    try:
        recipes = json.loads(RECIPE_FILE.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read the checkpoint recipes {RECIPE_FILE}: {err}") from err
    return {k: v for k, v in recipes.items() if not k.startswith("_")}


def _versions() -> dict:
    from harness.run.machine import versions

    return versions(("omnivoice", "transformers", "tokenizers", "torch"))


def _builder_source() -> str:
    """The code that turns a recipe into weights: a change to it is a new checkpoint, as a recipe change is."""
    import inspect

    from harness.model import codec

    functions = (train_text_tokenizer, _write_checkpoint, codec.calibrate, codec.calibration_audio,
                 codec.scale_layers, codec.fill_codebooks)
    source = "\n".join(inspect.getsource(f) for f in functions)
    # Where a module lives is not how weights are made: the key hashes the import of the codec as it was spelled
    # before the harness had rooms (harness/codec.py), so the move to harness/model/ kept every checkpoint's key.
    return source.replace("from harness.model import codec", "from harness import codec")


def checkpoint_key(size: str) -> str:
    """Cache key: recipe, tokenizer corpus, the builder's code and the versions of the classes that build the
    weights. A checkpoint cached under another recipe or builder is never reused."""
    recipes = load_recipes()
    if size not in recipes:
        raise CheckpointError(f"unknown checkpoint size {size!r}; known: {sorted(recipes)} (see {RECIPE_FILE})")
    blob = json.dumps(
        {"recipe": recipes[size], "corpus": TOKENIZER_CORPUS.read_text(encoding="utf-8"), "versions": _versions(),
         "builder": hashlib.sha256(_builder_source().encode()).hexdigest()},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("FASTPATH_CACHE", REPO_ROOT / ".cache"))


def train_text_tokenizer(vocab_size: int):
    """Byte-level BPE over the fixture corpus, so any text (Chinese, digits) tokenises without <unk>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    lines = [
        line for line in TOKENIZER_CORPUS.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", *SPECIAL_TOKENS, *NONVERBAL_TAGS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    if tok.get_vocab_size() <= AUDIO_MASK_ID + 1:
        raise CheckpointError(
            f"the trained text vocabulary has {tok.get_vocab_size()} entries, not more than the audio mask id "
            f"{AUDIO_MASK_ID}; add text to {TOKENIZER_CORPUS}"
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS + NONVERBAL_TAGS,
    )


def _write_checkpoint(recipe: dict, out: Path) -> None:
    import torch
    from omnivoice.models.omnivoice import OmniVoice, OmniVoiceConfig
    from transformers import (
        DacFeatureExtractor,
        HiggsAudioV2TokenizerConfig,
        HiggsAudioV2TokenizerModel,
        Qwen3Config,
    )

    from harness.model import codec

    text_tokenizer = train_text_tokenizer(recipe["text_tokenizer_vocab"])
    llm = Qwen3Config(**recipe["llm"])
    if len(text_tokenizer) > llm.vocab_size:
        raise CheckpointError(f"llm vocab_size {llm.vocab_size} < text vocabulary {len(text_tokenizer)} in the recipe")
    llm._attn_implementation = "sdpa"
    config = OmniVoiceConfig(llm_config=llm)

    if "codec" not in recipe:
        raise CheckpointError(f"the recipe has no 'codec' section ({RECIPE_FILE}): without it the codec's codebooks stay "
                              f"zero and its decoder ignores the codes; add one as the other sizes have it")
    at = recipe["audio_tokenizer"]
    # hop 8*5*4*2*3 = 960 samples at 24 kHz -> 25 frames/s; 2 kbps / (25 * 10 bits) -> 8 codebooks
    ratios = [8, 5, 4, 2, 3]
    audio_config = HiggsAudioV2TokenizerConfig(
        target_bandwidths=[0.5, 1, 1.5, 2],
        sample_rate=24000,
        codebook_size=1024,
        codebook_dim=at["codebook_dim"],
        acoustic_model_config=dict(at["acoustic"], downsampling_ratios=ratios, upsampling_ratios=ratios),
        semantic_model_config=dict(at["semantic"]),
    )
    assert audio_config.frame_rate == 25 and audio_config.num_quantizers == config.num_audio_codebook

    fork_devices: list = []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(recipe["seed"])
        model = OmniVoice(config)
        audio_tokenizer = HiggsAudioV2TokenizerModel(audio_config)
    codec.calibrate(audio_tokenizer.eval(), recipe["codec"])
    model.save_pretrained(out)
    text_tokenizer.save_pretrained(out)
    audio_tokenizer.save_pretrained(out / "audio_tokenizer")
    DacFeatureExtractor(sampling_rate=24000, hop_length=960).save_pretrained(out / "audio_tokenizer")


def build_checkpoint(size: str = "tiny", root: Path | None = None) -> Path:
    """Build (once) and return the folder of the `size` test checkpoint. Same recipe -> same weights."""
    recipes = load_recipes()
    key = checkpoint_key(size)
    root = Path(root) if root is not None else cache_dir() / "checkpoints"
    final = root / f"{size}-{key}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    # one builder per machine: the others (xdist workers, parallel commands) wait for it and reuse its folder
    with FileLock(str(root / f".{size}-{key}.lock")):
        if not (final / "config.json").is_file():
            _build_into(recipes[size], size, key, root, final)
    return final


def _build_into(recipe: dict, size: str, key: str, root: Path, final: Path) -> None:
    """Built with the torch threads the process started with: the codec's calibration reduces in parallel, and its
    bits follow the thread count (one thread and two give another audio tokenizer), so a build inside a pytest-xdist
    worker, which runs on its share of the threads, must give what the install's build gives."""
    import torch

    had, want = torch.get_num_threads(), started_threads()
    if want != had:
        torch.set_num_threads(want)
    try:
        _build(recipe, size, key, root, final)
    finally:
        if want != had:
            torch.set_num_threads(had)


def _build(recipe: dict, size: str, key: str, root: Path, final: Path) -> None:
    print(f"building the {size} test checkpoint into {final} (seeded weights, then the codec's calibration; once)",
          file=sys.stderr, flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{size}-", dir=root))
    tmp.chmod(0o755)
    try:
        _write_checkpoint(recipe, tmp)
        (tmp / "fastpath_recipe.json").write_text(
            json.dumps({"size": size, "key": key, "recipe": recipe, "versions": _versions()}, indent=1)
        )
        try:
            os.replace(tmp, final)  # atomic: a reader never sees a half-built folder
        except OSError:
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def find_hf_cache() -> Path | None:
    """A snapshot of k2-fsa/OmniVoice in the local Hugging Face cache, if one is there (never downloads)."""
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
    snapshots = hub / ("models--" + HF_REPO_ID.replace("/", "--")) / "snapshots"
    if not snapshots.is_dir():
        return None
    for snap in sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True):
        if (snap / "config.json").is_file():
            return snap
    return None


def check_checkpoint_folder(path: Path) -> Path:
    path = Path(path).expanduser()
    how = (f"Pass --checkpoint PATH or set {ENV_CHECKPOINT}=PATH to a local OmniVoice checkpoint folder "
           f"(the one holding config.json and audio_tokenizer/), or unset it to use the built test checkpoint.")
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist. {how}")
    config = path / "config.json"
    if not config.is_file():
        raise CheckpointError(f"checkpoint {path} has no config.json. {how}")
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{config} is not valid JSON ({err}). {how}") from err
    if model_type != "omnivoice":
        raise CheckpointError(f"{path} holds a {model_type!r} model, not an OmniVoice checkpoint. {how}")
    return path


def resolve_checkpoint(explicit: str | None = None, size: str = "tiny") -> Checkpoint:
    """The user's checkpoint (option, then env var; 'hf' means the local HF cache), else the built one."""
    explicit = explicit or os.environ.get(ENV_CHECKPOINT) or None
    if explicit == "hf":
        found = find_hf_cache()
        if found is None:
            raise CheckpointError(
                f"no snapshot of {HF_REPO_ID} in the local Hugging Face cache. Download it where a hub is "
                f"reachable (huggingface-cli download {HF_REPO_ID}) or pass --checkpoint PATH."
            )
        return Checkpoint(found, "real")
    if explicit:
        return Checkpoint(check_checkpoint_folder(Path(explicit)), "real")
    return Checkpoint(build_checkpoint(size), size)


def load_model(checkpoint: Checkpoint | Path | str, device: str = "cpu", dtype=None):
    """Load through the real `OmniVoice.from_pretrained` (tokenizers included)."""
    import torch
    from omnivoice import OmniVoice

    path = checkpoint.path if isinstance(checkpoint, Checkpoint) else check_checkpoint_folder(Path(checkpoint))
    model = OmniVoice.from_pretrained(str(path), device_map=device, dtype=dtype or torch.float32)
    return model.eval()


def add_model_arguments(parser, size: str = "tiny") -> None:
    """--size (a test checkpoint's size or a checkpoint path), --device and --dtype: the model a command loads
    (`load_model_of`)."""
    parser.add_argument("--size", default=size, help="test checkpoint size (tiny, full), or a checkpoint path")
    parser.add_argument("--device", default="cpu", help="torch device")
    parser.add_argument("--dtype", default=None, help="e.g. bfloat16 (default: the model's float32)")


def load_model_of(args) -> tuple:
    """(checkpoint, model) that add_model_arguments' options name."""
    import torch

    named = args.size in ("tiny", "full")
    checkpoint = resolve_checkpoint(None if named else args.size, size=args.size if named else "tiny")
    return checkpoint, load_model(checkpoint, device=args.device, dtype=getattr(torch, args.dtype) if args.dtype else None)


def main(argv=None) -> int:
    import argparse

    from harness.model import codec

    from harness.run import results

    parser = argparse.ArgumentParser(prog="fastpath-suite maintain checkpoint", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--size", nargs="+", choices=sorted(load_recipes()), default=["tiny"],
                        help="which built test checkpoints (each is built first if not cached)")
    parser.add_argument("--checkpoint", default=None, help="a real checkpoint folder instead of the built ones")
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    figures = {}
    for size in [None] if args.checkpoint else args.size:
        try:
            found = resolve_checkpoint(args.checkpoint, size=size or "tiny")
        except CheckpointError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"checkpoint: {found.path} ({found.kind})")
        figures[found.kind] = dict(codec.measure(load_model(found)), checkpoint=found.identity)
        print(codec.describe(figures[found.kind]))
    results.write_if_asked(args, "codec", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
