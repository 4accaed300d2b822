"""Checkpoints: the policy as a standard Hugging Face directory, the trainer state beside it, written atomically.

Layout of ``<output_dir>/checkpoints/step-00000010/``::

    policy/                    # model.save_pretrained + processor.save_pretrained: loads in plain transformers / vLLM
    trainer_state.pt           # optimizer, scheduler, step, data stream, counters (rank 0)
    engine/                    # train.backend=deepspeed only: DeepSpeed's save_checkpoint (partitioned optimizer state)
    rng_rank{R}.pt             # Python, NumPy and torch RNG states of rank R
    COMPLETE                   # written last; a directory without it is never used

Everything is first written to ``.tmp-step-...`` and renamed to its final name, so a crash at any point leaves the
previous checkpoint as the latest complete one.

Loading is safe and checked. ``trainer_state.pt`` and ``rng_rank*.pt`` hold only tensors and plain Python data and are
read with ``torch.load(weights_only=True)``, so a crafted file cannot run code. :func:`latest_checkpoint` verifies a
checkpoint before offering it (the marker parses, the state files load, the policy's config and safetensors headers
are intact) and falls back to the newest good one with a warning that names each bad one. Deleting a checkpoint
removes its ``COMPLETE`` marker first, so an interrupted deletion never leaves a "complete" checkpoint without state.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmgpg import distributed
from mmgpg.rundir import (
    _STEP_DIR,
    _read_marker,
    checkpoint_root,
    complete_checkpoints,
    latest_checkpoint,
)
from mmgpg.typed import CheckpointError
from mmgpg.utils import safe_load


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states as tensors and plain data (loadable with ``weights_only=True``)."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {"python": [version, torch.tensor(internal, dtype=torch.int64), gauss],
             "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(int(x) for x in internal.tolist()), gauss))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint directory, its ``COMPLETE`` marker first (an interrupted deletion leaves it incomplete)."""
    (path / "COMPLETE").unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def save_checkpoint(output_dir: str | Path, step: int, policy, trainer_state: dict[str, Any], keep_last: int,
                    extra_files: dict[str, str] | None = None, backend=None, warn=None) -> Path:
    """Write checkpoint ``step`` (collective: every rank calls it) and prune to the newest ``keep_last`` intact
    ones (:func:`prune_checkpoints`; ``warn`` receives what it says about damaged ones, default stderr).

    ``extra_files`` (name → text) are written beside the state by rank 0 (the resolved config). ``backend``
    (optional) supplies the full weights when the model's own are partitioned (``full_state_dict``, gathered on every
    rank, written by rank 0) and writes its own state into ``engine/`` (``save_engine_state``, every rank). A LoRA
    policy is written merged (``policy/``) and as its adapter (``adapter/``)."""
    from mmgpg.models.lora import ADAPTER_DIR, is_lora, save_adapter
    from mmgpg.models.save import save_policy

    info = distributed.current()
    full = backend.full_state_dict() if backend is not None else None
    adapter = backend.trainable_state_dict(policy.peft) if backend is not None and is_lora(policy) else None
    root = checkpoint_root(output_dir)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    writing = ""  # the part being written, named when the disk fills
    try:
        if info.is_main:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            writing = "policy/"
            save_policy(policy, tmp / "policy", full)  # merged / gathered: loads in plain transformers and vLLM
            if is_lora(policy):
                writing = f"{ADAPTER_DIR}/"
                save_adapter(policy, tmp / ADAPTER_DIR, adapter)
            writing = "trainer_state.pt"
            torch.save(trainer_state, tmp / "trainer_state.pt")
            for name, text in (extra_files or {}).items():
                writing = name
                (tmp / name).write_text(text, encoding="utf-8")
        distributed.barrier()
        if backend is not None:
            writing = "engine/"
            backend.save_engine_state(tmp / "engine")
        writing = f"rng_rank{info.rank}.pt"
        torch.save(rng_state(), tmp / f"rng_rank{info.rank}.pt")
        distributed.barrier()
        if info.is_main:
            writing = "COMPLETE"
            (tmp / "COMPLETE").write_text(json.dumps({"step": step, "world_size": info.world_size}) + "\n")
    except Exception as err:  # noqa: BLE001 - torch, safetensors and the OS report a full disk each their own way
        # Before the partial folder is removed: removing it frees the space the check looks for.
        disk_full = _is_disk_full(err, root)
        partial = folder_bytes(tmp) if info.is_main else 0
        if info.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if disk_full:
            previous = latest_checkpoint(output_dir, warn=lambda _m: None)
            raise CheckpointError(no_space_message(
                f"{writing} of checkpoint {final}", err, root, need=max(folder_bytes(previous), partial),
                intact=(f"The partial checkpoint was removed; the previous one, {previous}, is intact."
                        if previous else "The partial checkpoint was removed; no earlier checkpoint exists."),
                fix=f"older checkpoints of this or other runs (a save needs room for one more than train.keep_last="
                    f"{keep_last} keeps; lower it), or set output_dir on a larger disk; then continue with "
                    "train.resume=true.")) from err
        raise
    if info.is_main:
        if final.exists():  # a checkpoint of this step from an earlier, interrupted attempt
            remove_checkpoint(final)
        tmp.rename(final)
        prune_checkpoints(output_dir, keep_last, warn=warn)
        for stale in root.iterdir():  # interrupted writes and deletions: directories that are not checkpoints
            if stale.is_dir() and (stale.name.startswith(".tmp-step-")
                                   or (_STEP_DIR.fullmatch(stale.name) and not (stale / "COMPLETE").exists())):
                shutil.rmtree(stale, ignore_errors=True)
    distributed.barrier()
    return final


def prune_checkpoints(output_dir: str | Path, keep_last: int, warn=None) -> list[Path]:
    """Keep the newest ``keep_last`` *intact* checkpoints (:func:`mmgpg.rundir.verify_checkpoint`) and remove the
    older ones, so a damaged checkpoint never takes the place of an intact one. A damaged checkpoint is not counted:
    one newer than the oldest kept stays where it is (named through ``warn``: a resume skips it); one older is removed
    with the rest. Returns the kept intact checkpoints, newest first."""
    from mmgpg.rundir import _warn, verify_checkpoint

    warn = warn or _warn
    kept: list[Path] = []
    damaged: list[Path] = []
    for candidate in reversed(complete_checkpoints(output_dir)):
        if len(kept) >= keep_last:
            remove_checkpoint(candidate)
            continue
        try:
            verify_checkpoint(candidate)
        except CheckpointError as err:
            damaged.append(candidate)
            warn(f"checkpoint {candidate} is damaged ({err}); train.keep_last does not count it")
            continue
        kept.append(candidate)
    for bad in damaged:
        if kept and int(bad.name[5:]) < int(kept[-1].name[5:]):
            remove_checkpoint(bad)
    return kept


def _is_disk_full(err: BaseException, root: Path) -> bool:
    """Whether ``err`` (raised while writing under ``root``) is a full disk: the OS said so, or the filesystem has
    under 1 MiB free (torch reports a short write as "unexpected pos", safetensors as "os error 28"). Check before the
    partial files are deleted."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(err)
    if "No space left on device" in text or "os error 28" in text or "file write failed" in text:
        return True
    try:
        return shutil.disk_usage(root).free < 1 << 20
    except OSError:
        return False


def folder_bytes(path: Path | None) -> int:
    """Bytes in the files under ``path`` (0 for None or a missing folder)."""
    if path is None or not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _mount_point(path: Path) -> Path:
    path = path.resolve()
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def no_space_message(what: str, err: BaseException, root: Path, need: int, intact: str, fix: str) -> str:
    """The message for a write of ``what`` under ``root`` that filled the disk: what failed, the space it needs
    (``need`` bytes, e.g. the previous checkpoint's size), what is free now, how much to free and where."""
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = 0
    mib = 1 << 20
    needed = (f"it needs about {need // mib + 1} MiB (the previous one's size, or what was written before the disk "
              f"filled) and {free // mib} MiB are free on {_mount_point(root)}, so free at least "
              f"{max(need - free, 0) // mib + 1} MiB there" if need else
              f"{free // mib} MiB are free on {_mount_point(root)}; free at least as much as the model's weights take")
    return (f"no space left on device while writing {what} ({type(err).__name__}: {str(err).splitlines()[0][:200]}"
            f"). {intact} To continue, {needed}: {fix}")


def save_model_dir(target: Path, write, *, intact: str) -> Path:
    """Write a folder (``write(tmp)`` fills it) as ``target`` atomically, as checkpoints are: into ``.tmp-NAME/``
    beside it, then renamed; an older ``target`` is replaced only after the new one is complete. A kill or a full
    disk leaves the old folder or none, never a half-written one (the temporary folder is removed, or by the next
    write). A full disk is a :class:`CheckpointError` saying what to free; ``intact`` says what is still usable."""
    target = Path(target)
    tmp, old = target.with_name(f".tmp-{target.name}"), target.with_name(f".old-{target.name}")
    for stale in (tmp, old):
        shutil.rmtree(stale, ignore_errors=True)
    try:
        write(tmp)
    except Exception as err:  # noqa: BLE001 - as in save_checkpoint
        disk_full = _is_disk_full(err, target.parent)
        shutil.rmtree(tmp, ignore_errors=True)
        if disk_full:
            raise CheckpointError(no_space_message(
                f"{target}", err, target.parent, need=folder_bytes(target), intact=f"Nothing was left half-written "
                f"at {target}. {intact}", fix="delete older checkpoints or other files there, or choose an "
                "output_dir on a larger disk.")) from err
        raise
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def load_trainer_state(checkpoint: Path, any_world_size: bool = False) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(trainer_state, this rank's rng state)`` of a complete checkpoint (safe loads; clear errors). A checkpoint
    written by another number of ranks is refused, unless ``any_world_size`` (a backend that loads its state on
    another count: :attr:`mmgpg.backends.TrainingBackend.resumes_on_any_world_size`); the rng state is then None
    (the caller re-derives it: :func:`resharded_seed`)."""
    info = distributed.current()
    meta = _read_marker(checkpoint)
    same = meta["world_size"] == info.world_size
    if not same and not any_world_size:
        raise CheckpointError(f"{checkpoint} was written by {meta['world_size']} ranks; this run has "
                              f"{info.world_size}. Resume with the same number of processes (this backend's state "
                              "cannot be re-split).")
    try:
        return (safe_load(checkpoint / "trainer_state.pt"),
                safe_load(checkpoint / f"rng_rank{info.rank}.pt") if same else None)
    except CheckpointError as err:
        raise CheckpointError(f"checkpoint {checkpoint}: {err}") from None


def checkpoint_world_size(checkpoint: Path) -> int:
    """The number of ranks that wrote ``checkpoint`` (its ``COMPLETE`` marker)."""
    return int(_read_marker(checkpoint)["world_size"])


def resharded_seed(seed: int, step: int, rank: int) -> int:
    """The seed of rank ``rank``'s random generators when a run resumes at ``step`` on another number of ranks
    (the saved per-rank states belong to ranks that no longer exist): ``((seed · 1_000_003 + step) · 65_537 + rank)
    mod 2^63``. Deterministic, so two resumes of the same checkpoint on the same count draw the same numbers, and
    distinct for each rank.

    >>> resharded_seed(0, 2, 0), resharded_seed(0, 2, 1)
    (131074, 131075)
    """
    return ((seed * 1_000_003 + step) * 65_537 + rank) % 2**63
