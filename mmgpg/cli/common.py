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
