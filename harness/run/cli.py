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
