"""What every command module shares: the config arguments (``GROUP=NAME`` and ``a.b=c``, ``--config-dir``) and
their resolution. Imports nothing heavy (``mmgpg --help`` must not import torch)."""

from __future__ import annotations

import argparse

OVERRIDES_HELP = (
    "config groups GROUP=NAME (e.g. task=shapes model=tiny) and field overrides a.b=c "
    "(e.g. rollout.group_size=4); `mmgpg config show --doc` documents every field"
)


def add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=OVERRIDES_HELP)
    p.add_argument("--config-dir", action="append", default=[], metavar="DIR",
                   help="extra folder with base.yaml and group folders, searched before the built-in configs/")


def resolve_args(args):
    """The resolved config of a command's ``overrides`` and ``--config-dir`` arguments."""
    from mmgpg.config import resolve

    return resolve(args.overrides, config_dirs=args.config_dir)


# ---- flag values: refused by argparse (exit 2, naming the flag) before anything runs ---------------------------------


def seed_flag(text: str) -> int:
    """An argparse ``type`` for ``--seed``: an integer in ``[0, SEED_MAX]``."""
    from mmgpg.typed import SEED_MAX

    return int_in(0, SEED_MAX)(text)


seed_flag.__name__ = "seed"


def int_in(low: int, high: int):
    """An argparse ``type``: an integer in ``[low, high]``.

    >>> int_in(1, 8)("4"), int_in(0, 3)("0")
    (4, 0)
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number from {low} to {high}; got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}; got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


def float_in(low: float, high: float, *, low_open: bool = False):
    """An argparse ``type``: a finite number in ``[low, high]`` (``(low, high]`` when ``low_open``); NaN and
    infinities are refused.

    >>> float_in(0, 1, low_open=True)("0.5")
    0.5
    """
    import math

    interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number in {interval}; got {text!r}") from None
        if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
            raise argparse.ArgumentTypeError(f"must be a finite number in {interval}; got {text}")
        return value

    parse.__name__ = "number"
    return parse
