"""What the package's command lines share: typed argument parsers that say what is wrong."""

from __future__ import annotations

import argparse


def int_at_least(minimum: int):
    """An argparse `type` for integers >= minimum; anything else raises ArgumentTypeError naming the bound."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from err
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be at least {minimum}")
        return value

    parse.__name__ = f"integer >= {minimum}"  # argparse names the type in its error message
    return parse


def add_model_arguments(parser, size: str = "tiny") -> None:
    """--size (a test checkpoint's size or a checkpoint path), --device and --dtype: the model a command loads
    (`load_model_of`)."""
    parser.add_argument("--size", default=size, help="test checkpoint size (tiny, full), or a checkpoint path")
    parser.add_argument("--device", default="cpu", help="torch device")
    parser.add_argument("--dtype", default=None, help="e.g. bfloat16 (default: the model's float32)")


def load_model_of(args) -> tuple:
    """(checkpoint, model) that add_model_arguments' options name."""
    import torch

    from harness.checkpoint import load_model, resolve_checkpoint

    named = args.size in ("tiny", "full")
    checkpoint = resolve_checkpoint(None if named else args.size, size=args.size if named else "tiny")
    return checkpoint, load_model(checkpoint, device=args.device, dtype=getattr(torch, args.dtype) if args.dtype else None)
