"""DeepSpeed's own checkpoint files (a checkpoint's ``engine/``): the safe loader mmgpg's verification and
DeepSpeed's load both read them with, and the conversion to DeepSpeed's universal checkpoint that lets a run resume
on another number of ranks (:meth:`mmgpg.backends.deepspeed.DeepSpeedBackend.load_engine_state`). Imports
DeepSpeed only inside the functions that need it."""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path
from typing import Any

from mmgpg.typed import CheckpointError

# DeepSpeed's own state files (engine/): read by mmgpg's verification and by DeepSpeed's load through one loader.
ENGINE_SAFE_GLOBALS = ("deepspeed.runtime.fp16.loss_scaler.LossScaler", "deepspeed.runtime.zero.config.ZeroStageEnum",
                       "deepspeed.utils.tensor_fragment.fragment_address")
"""The only types besides tensors and plain data that DeepSpeed's state files hold (ZeRO 0-3 with mmgpg's settings,
DeepSpeed 0.19): the ZeRO optimizer's static loss scaler (scale 1; mmgpg refuses fp16), the ZeRO-stage enum and a
parameter fragment's ``(numel, start)`` address. Unpickling them only rebuilds those objects from plain data (the enum
by looking its value up; the two classes have no ``__setstate__``, so their attributes are set as data); every other
global is refused, with its name in the message."""
ENGINE_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")  # DeepSpeed copies its conversion scripts beside the state;
# nothing loads or runs them (they are for a user converting the state by hand)


def engine_safe_globals() -> list:
    """The classes of :data:`ENGINE_SAFE_GLOBALS` (imports DeepSpeed; ImportError when it is not installed)."""
    import importlib

    out = []
    for name in ENGINE_SAFE_GLOBALS:
        module, _, attr = name.rpartition(".")
        out.append(getattr(importlib.import_module(module), attr))
    return out


def load_engine_file(path: str | Path, map_location: Any = None) -> Any:
    """One of DeepSpeed's state files, loaded with ``weights_only=True`` and only :data:`ENGINE_SAFE_GLOBALS` allowed:
    the loader :meth:`~mmgpg.backends.deepspeed.DeepSpeedBackend.load_engine_state` gives DeepSpeed in place of its
    own ``weights_only=False`` one."""
    from mmgpg.utils import safe_load

    path = Path(path)
    return safe_load(path, allow=engine_safe_globals(), label=f"engine/{path.parent.name}/{path.name}",
                      map_location=map_location)


def to_universal(state: Path, out: Path) -> None:
    """DeepSpeed's own converter (``deepspeed.checkpoint.ds_to_universal``, the ``ds_to_universal.py`` script's
    ``main``) from one ``save_checkpoint`` tag directory ``state`` (ZeRO stage 1-3, any number of ranks) to a
    universal checkpoint in ``out``: every parameter's fp32 value and Adam moments whole, in ``out/zero/<name>/``,
    which ``load_checkpoint`` with ``checkpoint.load_universal`` splits for the loading ranks. An existing ``out``
    (a conversion interrupted earlier) is replaced. Its print-outs and progress bars are kept back, and shown (the
    last lines) only in the error when it fails.

    The converter unpickles with ``weights_only=False``: it only reads ``state``, which mmgpg's verification loaded
    with ``weights_only=True`` before the checkpoint was chosen, and the loading ranks read what it wrote here."""
    import argparse
    import io
    import os

    from deepspeed.checkpoint import ds_to_universal

    if out.parent.exists():
        shutil.rmtree(out.parent)
    out.parent.mkdir(parents=True)
    workers = max(1, min(4, os.cpu_count() or 1))
    args = argparse.Namespace(input_folder=str(state), output_folder=str(out), num_extract_workers=workers,
                              num_merge_workers=workers, keep_temp_folder=False, strict=True,
                              inject_missing_state=True)  # the version record a Megatron client saves; mmgpg's
    # models have no tensor or pipeline parallelism, so DeepSpeed's default record is the right one
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said), quiet():
            ds_to_universal.main(args)
    except BaseException as err:
        tail = "\n".join(said.getvalue().splitlines()[-20:])
        raise RuntimeError(f"{type(err).__name__}: {err}" + (f"; the converter said:\n{tail}" if tail else "")) from err


@contextlib.contextmanager
def quiet():
    """DeepSpeed logs every step and set-up detail at INFO on every rank; keep warnings and errors. What it prints
    itself (e.g. "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully" once per rank at start-up)
    is kept back and shown on stderr only when the call fails."""
    import io
    import logging

    from deepspeed.utils import logger

    level = logger.level
    logger.setLevel(logging.WARNING)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            yield
    except BaseException:
        sys.stderr.write(printed.getvalue())
        raise
    finally:
        logger.setLevel(level)


def verify_checkpoint(checkpoint: Path, state: dict, world_size: int) -> None:
    """The DeepSpeed backend's part of :func:`mmgpg.rundir.verify_checkpoint`: a checkpoint written under
    ``train.backend=deepspeed`` (its ``trainer_state.pt`` has a ``deepspeed`` entry, or it has an ``engine/``
    folder) has a whole, safely loadable ``engine/`` (:func:`verify_engine_dir`); any other has nothing of ours."""
    if "deepspeed" not in state and not (checkpoint / "engine").exists():
        return
    ds = state.get("deepspeed")
    stage = int(ds["zero_stage"]) if isinstance(ds, dict) and isinstance(ds.get("zero_stage"), int) else None
    verify_engine_dir(checkpoint / "engine", world_size if stage is not None else None, stage)


def verify_engine_dir(engine: Path, world_size: int | None = None, zero_stage: int | None = None) -> None:
    """DeepSpeed's ``engine/``: it holds model states, and every file in it (but DeepSpeed's two conversion scripts)
    loads with ``weights_only=True`` and :data:`ENGINE_SAFE_GLOBALS`. Without
    DeepSpeed installed (a checkpoint read for evaluation elsewhere) the pickles' globals are listed instead of
    loaded: still nothing is unpickled.

    With the run's ``world_size`` and ``zero_stage`` (from the marker and ``trainer_state.pt``), also what
    DeepSpeed's load will read (:func:`engine_files`): every rank's file is there, and each holds its part (model
    states a ``module``, optimizer states an ``optimizer_state_dict``). A checkpoint that fails is skipped like any
    damaged one, before DeepSpeed sees it (a missing or emptied file made DeepSpeed's load raise mid-resume)."""
    if not engine.is_dir():
        raise CheckpointError("engine/ (DeepSpeed's optimizer state) is missing")
    from mmgpg.utils import safe_load

    files = sorted(p for p in engine.rglob("*")
                   if p.is_file() and not (p.parent == engine and p.name in ENGINE_SCRIPTS))
    if not any(p.name.endswith("model_states.pt") for p in files):
        raise CheckpointError("engine/ holds no DeepSpeed model states (*model_states.pt)")
    expected = engine_files(engine, world_size, zero_stage) if world_size is not None and zero_stage is not None else {}
    for path, alternatives in expected.items():
        if not any(p.is_file() for p in alternatives):
            raise CheckpointError(f"engine/{path} is missing (DeepSpeed's load reads one such file per rank for ZeRO "
                                  f"stage {zero_stage} on {world_size} rank(s))")
    try:
        allow = engine_safe_globals()
    except ImportError:
        allow = None
    for path in files:
        label = f"engine/{path.relative_to(engine)}"
        if allow is not None:
            content = safe_load(path, mmap=True, allow=allow, label=label)
            need = ("module" if path.name.endswith("model_states.pt") else
                    "optimizer_state_dict" if path.name.endswith("optim_states.pt") else None)
            if need is not None and expected and not (isinstance(content, dict) and need in content):
                raise CheckpointError(f"{label} holds no {need!r} (not one of DeepSpeed's state files, or emptied)")
            continue
        import torch

        try:
            unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(path)) - set(ENGINE_SAFE_GLOBALS)
        except Exception as err:  # noqa: BLE001 - not a torch zip file, truncated, ...
            raise CheckpointError(f"{label} is unreadable ({type(err).__name__}: {str(err)[:200]})") from None
        if unsafe:
            raise CheckpointError(f"{label} holds Python objects other than tensors and plain data "
                                  f"({', '.join(sorted(unsafe))}); mmgpg does not unpickle those (they can run code)")


def engine_files(engine: Path, world_size: int, zero_stage: int) -> dict[str, list[Path]]:
    """The files DeepSpeed's ``load_checkpoint(engine, tag="state")`` reads, as ``{name: [paths, any one will
    do]}`` (DeepSpeed 0.19's names): the model states — one ``mp_rank_00_model_states.pt``, or under ZeRO-3 one
    ``zero_pp_rank_R_mp_rank_00_model_states.pt`` per rank — and from stage 1 on one optimizer partition per rank,
    ``zero_pp_rank_R_mp_rank_00_optim_states.pt`` (``bf16_``-prefixed when bf16 is on)."""
    state = engine / "state"
    out: dict[str, list[Path]] = {}
    if zero_stage == 3:
        for r in range(world_size):
            out[f"state/zero_pp_rank_{r}_mp_rank_00_model_states.pt"] = [
                state / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"]
    else:
        out["state/mp_rank_00_model_states.pt"] = [state / "mp_rank_00_model_states.pt"]
    if zero_stage >= 1:
        for r in range(world_size):
            name = f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
            out[f"state/{name}"] = [state / name, state / f"bf16_{name}"]
    return out
