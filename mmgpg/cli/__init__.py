"""The ``mmgpg`` command. Each subcommand's ``--help`` says what it does; config arguments are ``GROUP=NAME`` and
``a.b=c`` (see ``mmgpg config show --doc`` for every field).

One module per command family, each with ``register(sub)`` that adds its subcommands; a command imports what it
needs inside its function, so ``mmgpg --help`` imports no torch. May import everything below it.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

# The command modules, in the order `mmgpg --help` lists their commands.
COMMAND_MODULES = ("train", "eval", "sample", "inspect", "plan", "theory", "serve")


def build_parser() -> argparse.ArgumentParser:
    from mmgpg import __version__
    from mmgpg.models import FAMILIES

    parser = argparse.ArgumentParser(
        prog="mmgpg",
        description="GPG (Group Policy Gradient), GRPO and their baselines for vision-language and text models; the "
                    "model families: " + ", ".join(FAMILIES) + ".",
    )
    parser.add_argument("--version", action="version", version=f"mmgpg {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the full traceback when a command fails")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"mmgpg.cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # Overrides may come before or after options (`mmgpg sample --prompts 4 task=shapes model=tiny`).
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(a.startswith("-") or "=" not in a for a in extra):
            parser.error("unrecognized arguments: " + " ".join(extra))
        args.overrides = [*args.overrides, *extra]
    clean = False
    try:
        code = _run(args)
        clean = code == 0
        return code
    finally:
        if argv is None:  # a real process (console script, python -m mmgpg): the work is done or given up, so a
            # late Ctrl-C during interpreter shutdown must not print a KeyboardInterrupt traceback
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            if "torch.distributed" in sys.modules:  # (--help imports no torch; in-process callers, e.g. tests,
                from mmgpg import distributed  # keep their own process group)

                distributed.finish(clean)


def _run(args) -> int:
    from mmgpg.task import TaskNotFound
    from mmgpg.typed import ConfigError

    try:
        for folder in getattr(args, "config_dir", None) or []:
            if not Path(folder).is_dir():
                raise FileNotFoundError(f"--config-dir {folder!r} is not a directory; give a folder holding base.yaml "
                                        "and/or group folders (task/, model/, algo/)")
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"mmgpg {args.command}: interrupted (a run continues from its last checkpoint with "
              "train.resume=true)", file=sys.stderr)
        return 130
    except Exception as err:
        message = None if args.debug else user_error(err, (ConfigError, TaskNotFound))
        if message is None:  # a bug, or --debug: the full traceback
            raise
        print(f"mmgpg {args.command}: {message}", file=sys.stderr)
        return 2


def user_error(err: BaseException, known: tuple[type, ...]) -> str | None:
    """The one-message form of an error caused by input (config, files, data, disk), or None for a bug."""
    import errno

    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" writing {err.filename}" if err.filename else ""
        return f"no space left on device{where}. Free space and run again (train.resume=true continues a run)."
    if isinstance(err, (*known, ValueError, OSError)):  # bad values, files, permissions, an unreachable hub
        return str(err)
    return None


if __name__ == "__main__":
    raise SystemExit(main())
