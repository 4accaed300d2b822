"""Continuing a run without losing or rewriting its history.

* :func:`lock_run` — one run per run directory: a second run on the same ``output_dir`` is refused (it would
  interleave the logs), naming the one that holds it.
* :func:`truncate_logs` — on resume, the records after the checkpoint's step are removed from ``metrics.jsonl`` and
  ``prompt_success.jsonl`` by an atomic rewrite (temp file + rename: a kill leaves the old file or the new one, never
  an empty one); a torn last line is dropped with a warning.
* :func:`set_aside_logs` — ``train.resume=true`` on a run that has logs but no usable checkpoint (it stopped before
  its first save) starts from step 0; the old logs move to ``abandoned-<time>/`` so the new ones do not append to
  them (steps 1, 2, 1, 2, 3, ...) and nothing is deleted.
* :func:`config_changes` / :func:`check_config_changes` — every checkpoint stores the resolved config it was trained
  with (``config.yaml``). A resume with a different config is refused, naming each key (old → new), unless the change
  is run control (:data:`RUN_CONTROL`) or ``train.resume_config=new`` applies it; what it cannot apply (a LoRA
  adapter's shape or scale, :data:`LORA_FIXED`) is refused even then. Accepted changes are appended to
  ``config_changes.jsonl``; the run's ``config.yaml`` (how the run that trained started) is never rewritten.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from mmgpg.jsonl import read_jsonl, write_jsonl_atomic
from mmgpg.rundir import CONFIG, read_config_tree

LOGS = ("metrics.jsonl", "prompt_success.jsonl")

RUN_CONTROL = frozenset({
    "train.resume", "train.resume_config", "train.save_every", "train.keep_last", "train.progress",
    "train.status_every_s", "train.tensorboard", "train.wandb", "train.wandb_project", "train.eval_every",
    "train.eval_limit",
    "train.eval_samples", "train.eval_split", "train.probe_every", "train.probe_samples", "train.probe_limit",
    "output_dir", "device", "rollout.vllm_server_timeout", "rollout.vllm_sync_dir", "rollout.vllm_sync_channel",
    "rollout.vllm_sync_bucket_mb",
})
"""Keys that change how a run is driven and logged, not what it computes: they may differ on resume. Also
``rollout.vllm_server`` when it only moves (:func:`_moved_server`: a server restarted on another host or port);
switching between a colocated engine and a server is not run control."""


def _moved_server(key: str, old: Any, new: Any) -> bool:
    """``rollout.vllm_server`` changed from one server address to another (both non-empty)."""
    return key == "rollout.vllm_server" and isinstance(old, str) and isinstance(new, str) and bool(old) and bool(new)


def truncate_logs(run_dir: Path, last_step: int, warn=None) -> None:
    """Keep only the records of steps <= ``last_step`` in the run's JSONL logs (atomic rewrite)."""
    for name in LOGS:
        path = run_dir / name
        for stale in run_dir.glob(f".{name}.*.tmp"):  # a rewrite killed before its rename
            stale.unlink()
        if not path.exists():
            continue
        read = read_jsonl(path, torn_tail="drop", warn=warn)
        kept = []
        for number, row in zip(read.lines, read.rows):
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError(f"{path}:{number}: a record without an integer 'step' — this is not an mmgpg log; "
                                 "move it away or choose another output_dir")
            if row["step"] <= last_step:
                kept.append(row)
        write_jsonl_atomic(path, kept)


def usable_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint a resume will use, or None when the run has none at all. When it has complete checkpoints
    but every one is damaged, raise instead of starting over (a run must never restart from step 0 by accident)."""
    from mmgpg.rundir import _warn, complete_checkpoints, latest_checkpoint
    from mmgpg.typed import CheckpointError

    reasons: list[str] = []
    found = latest_checkpoint(run_dir, warn=reasons.append)
    if found is not None:
        for reason in reasons:  # the damaged newer ones, named (rank 0)
            _warn(reason)
    if found is None and complete_checkpoints(run_dir):
        raise CheckpointError("train.resume=true but no checkpoint of the run can be used:\n  " + "\n  ".join(reasons)
                              + "\nRestore or remove them, or start a new run in another output_dir (a checkpoint's "
                              "policy/ folder may still load as model.name_or_path).")
    return found


def set_aside_logs(run_dir: Path) -> Path | None:
    """Move the logs of a run that never checkpointed to ``run_dir/abandoned-<time>/``; return that folder."""
    present = [run_dir / n for n in (*LOGS, CONFIG, "tensorboard") if (run_dir / n).exists()]
    if not any(p.name in LOGS for p in present):
        return None
    target = run_dir / f"abandoned-{time.strftime('%Y%m%d-%H%M%S')}"
    target.mkdir()
    for path in present:
        shutil.move(str(path), str(target / path.name))
    return target


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and (not prefix or tree):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


# Keys a command does not read (changing them cannot change what the run computes): prefixes, and exceptions.
UNUSED_BY = {"train": (("sft.",), ()),
             "sft": (("algo.", "train."), ("train.split", "train.backend", "train.eval_split", "train.eval_limit"))}
SFT_RUN_CONTROL = frozenset({"sft.save_every", "sft.eval_every", "train.keep_last", "train.eval_limit",
                             "train.eval_split", "output_dir", "device", "rollout.vllm_server_timeout",
                             "rollout.vllm_sync_dir", "rollout.vllm_sync_channel", "rollout.vllm_sync_bucket_mb"})


def config_changes(old_tree: dict, new_tree: dict, command: str = "train") -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (old, new)}`` for every key that differs and that ``command`` reads (``sft.*`` is not used by
    train, ``algo.*`` and most of ``train.*`` not by sft; the resume switches themselves are not changes)."""
    old, new = _flatten(old_tree), _flatten(new_tree)
    from mmgpg.config import Config, to_dict

    # A key added to the schema after the checkpoint was written (e.g. model.lora.*) ran with its default.
    defaults = _flatten(to_dict(Config()))
    old.update({k: defaults[k] for k in set(new) - set(old) if k in defaults})
    keys = sorted(set(old) | set(new))
    ignored = ("train.resume", "train.resume_config")  # how this start was asked for, not what the run computes
    prefixes, used = UNUSED_BY[command]
    return {k: (old.get(k), new.get(k)) for k in keys
            if old.get(k) != new.get(k) and k not in ignored and (k in used or not k.startswith(prefixes))}


def read_checkpoint_config(checkpoint: Path, run_dir: Path) -> tuple[dict | None, str]:
    """The config a checkpoint was trained with: its own ``config.yaml``, else (older checkpoints) the run's."""
    for path in (checkpoint / CONFIG, run_dir / CONFIG):
        tree = read_config_tree(path)
        if tree is not None:
            return tree, str(path)
    return None, ""


LORA_FIXED = frozenset({"model.lora.rank", "model.lora.alpha", "model.lora.target_modules", "model.lora.vision",
                        "model.lora.merger", "model.lora.trainable_modules"})
"""LoRA keys a resume cannot change: the saved adapter's shapes (rank, which layers, which modules are trained in
full) and its scale (alpha) are the ones it was trained with. ``model.lora.dropout`` is not among them."""


def change_notes(changes: dict[str, tuple[Any, Any]], cfg, command: str = "train") -> dict[str, str]:
    """What an accepted change does where that is not what its name says: a new ``model.name_or_path`` does not
    replace the trained weights. Without LoRA the policy continues from the checkpoint's ``policy/``, so the new path
    is only the KL reference (``algo.kl_coef > 0``, train) or nothing at all; with LoRA it is the base model the saved
    adapter is put on from this step on."""
    if "model.name_or_path" not in changes:
        return {}
    if cfg.model.lora.rank > 0:
        text = ("it becomes the base model under the saved LoRA adapter from this step on; the adapter, trained on the "
                "old base, continues unchanged")
    elif command == "train" and cfg.algo.kl_coef > 0:
        text = ("the policy's weights still continue from the checkpoint's policy/; the new model is only the KL "
                "reference (algo.kl_coef > 0) from this step on")
    else:
        text = ("the policy's weights continue from the checkpoint's policy/ and nothing this run computes reads the new "
                "path (no LoRA base, no KL reference; only the logged memory plan does); to train another model, "
                "start a new run in another output_dir")
    return {"model.name_or_path": text}


def check_config_changes(changes: dict[str, tuple[Any, Any]], *, checkpoint: Path, source: str, apply: bool,
                         constant_lr: bool, command: str = "train", fixed: frozenset = frozenset(),
                         notes: dict[str, str] | None = None) -> tuple[dict, dict]:
    """Split ``changes`` into ``(run control, other)``; raise :class:`~mmgpg.config.ConfigError` listing the others
    unless ``apply``. ``train.max_steps`` is run control only under a constant learning rate (otherwise the schedule's
    length changes). A change of a key in ``fixed`` cannot be applied and is refused even with ``apply``. ``notes``
    (:func:`change_notes`) say in the refusal what a change would do."""
    from mmgpg.typed import ConfigError, Problem

    notes = notes or {}
    run_control = RUN_CONTROL if command == "train" else SFT_RUN_CONTROL
    steps = f"{command}.max_steps"
    control = {k: v for k, v in changes.items()
               if k in run_control or (k == steps and constant_lr) or _moved_server(k, *v)}
    other = {k: v for k, v in changes.items() if k not in control}
    if apply and (stuck := {k: v for k, v in other.items() if k in fixed}):
        raise ConfigError([Problem(k, new, f"train.resume_config=new cannot apply it: checkpoint {checkpoint} holds a "
                                   f"LoRA adapter trained with {old!r} ({source}), whose shapes and scale are fixed.",
                                   f"keep {k}={old!r} to continue this run, or start a new run in another output_dir "
                                   f"from its merged weights (model.name_or_path={checkpoint / 'policy'}).")
                           for k, (old, new) in stuck.items()])
    if other and not apply:
        fix = ("drop this override to continue as the checkpoint was trained, add train.resume_config=new to apply "
               "the new values from this step on (recorded in config_changes.jsonl), or start a new run in another "
               "output_dir")
        raise ConfigError([Problem(k, new, f"Checkpoint {checkpoint} was trained with {old!r} ({source})."
                                   + (f" With train.resume_config=new: {notes[k]}." if k in notes else ""), fix)
                           for k, (old, new) in other.items()])
    return control, other


def record_changes(run_dir: Path, checkpoint: Path, changes: dict[str, tuple[Any, Any]], how: str,
                   notes: dict[str, str] | None = None) -> None:
    """Append one line to ``config_changes.jsonl`` and say it on stderr, with what a change does (``notes``)."""
    if not changes:
        return
    notes = {k: v for k, v in (notes or {}).items() if k in changes}
    record = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "resumed_from": str(checkpoint), "how": how,
              "changes": {k: {"old": old, "new": new, **({"note": notes[k]} if k in notes else {})}
                          for k, (old, new) in changes.items()}}
    with open(run_dir / "config_changes.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=str) + "\n")
    listed = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items())
    print(f"resume: config changed since {checkpoint.name} ({how}): {listed}; recorded in "
          f"{run_dir / 'config_changes.jsonl'}", file=sys.stderr, flush=True)
    for key, note in notes.items():
        print(f"resume: {key}: {note}", file=sys.stderr, flush=True)


def check_config(cfg, checkpoint: Path, run_dir: Path, *, record: bool, command: str = "train") -> bool:
    """Refuse a resume whose config differs from the checkpoint's, unless the change is run control or
    ``train.resume_config=new`` applies it; record accepted changes (when ``record``). True when keys other than run
    control changed (the caller then applies them with the backend's ``apply_settings``)."""
    from mmgpg.config import to_yaml
    from mmgpg.typed import read_yaml

    t = cfg.train
    old, source = read_checkpoint_config(checkpoint, run_dir)
    if old is None:
        return False
    changes = config_changes(old, read_yaml(to_yaml(cfg), "the resolved config"), command)
    constant = t.lr_scheduler == "constant" if command == "train" else True  # sft's schedule is constant
    old_rank = changes.get("model.lora.rank", (cfg.model.lora.rank,))[0]
    uses_lora = cfg.model.lora.rank > 0 or (isinstance(old_rank, int) and old_rank > 0)
    notes = change_notes(changes, cfg, command)
    control, other = check_config_changes(changes, checkpoint=checkpoint, source=source, apply=t.resume_config == "new",
                                          constant_lr=constant, command=command,
                                          fixed=LORA_FIXED if uses_lora else frozenset(), notes=notes)
    if record:
        record_changes(run_dir, checkpoint, {**control, **other}, "train.resume_config=new" if other else "run control",
                       notes)
    return bool(other)


def lock_run(run_dir: Path, command: str, is_main: bool):
    """Lock the run directory for this run (:func:`mmgpg.runlock.lock_run_dir`) before anything in it is read or
    written: rank 0 takes the lock, every rank learns the outcome (a refusal raises on every rank, so no rank waits in
    a collective for one that stopped). Returns the lock on rank 0, None on the others."""
    from mmgpg import distributed
    from mmgpg.runlock import RunDirLocked, lock_run_dir

    lock, refused = None, None
    if is_main:
        try:
            lock = lock_run_dir(run_dir, command)
        except RunDirLocked as err:
            refused = str(err)
    refused = distributed.broadcast_object(refused)
    if refused is not None:
        raise RunDirLocked(refused)
    return lock


def start_or_resume(run_dir: Path, resume_requested: bool, is_main: bool = True) -> Path | None:
    """The checkpoint to continue from (``train.resume=true``), or None for a fresh start. A fresh start in a
    directory that already holds a run is refused; a resume of a run that never checkpointed starts from step 0 with
    its old logs set aside (by rank 0). Every rank calls it. Shared by ``mmgpg train`` and ``mmgpg sft``."""
    if not resume_requested:
        used = [p for p in ("metrics.jsonl", "checkpoints") if (run_dir / p).exists()]
        if used:
            raise FileExistsError(f"{run_dir} already holds a run ({', '.join(used)}); continue it with "
                                  "train.resume=true or choose another output_dir")
        return None
    checkpoint = usable_checkpoint(run_dir)
    if checkpoint is None and is_main:
        moved = set_aside_logs(run_dir) if run_dir.is_dir() else None
        if moved is not None:
            print(f"train.resume=true but {run_dir} has no usable checkpoint: starting from step 0; the earlier logs "
                  f"were moved to {moved}", file=sys.stderr, flush=True)
    return checkpoint


def save_run_state(run_dir: Path, step: int, policy, backend, stream, counters: dict, cfg, keep_last: int) -> Path:
    """Checkpoint ``step`` of a run (``mmgpg train`` or ``mmgpg sft``): the policy, the backend's optimizer and
    schedule, the data stream, the counters, and the resolved config the step was computed with."""
    from mmgpg.config import to_yaml
    from mmgpg.train.checkpoint import save_checkpoint

    state = {**backend.state_dict(), "stream": stream.state_dict(), "counters": counters}
    return save_checkpoint(run_dir, step, policy, state, keep_last, extra_files={CONFIG: to_yaml(cfg)},
                           backend=backend)


def restore_run_state(checkpoint: Path, run_dir: Path, cfg, backend, stream, settings, *, command: str,
                      is_main: bool) -> dict:
    """The inverse of :func:`save_run_state` after the policy was loaded from ``checkpoint/policy``: refuse (or,
    with train.resume_config=new, apply ``settings()``) a changed config before anything is loaded, restore the
    backend, the stream and this rank's RNG states (last: loading the model consumed random numbers), cut the logs
    back to the checkpoint's step (rank 0). Returns the saved counters."""
    from mmgpg import distributed
    from mmgpg.train.checkpoint import checkpoint_world_size, load_trainer_state, resharded_seed, set_rng_state
    from mmgpg.utils import seed_everything

    changed = check_config(cfg, checkpoint, run_dir, record=is_main, command=command)
    state, rng = load_trainer_state(checkpoint, any_world_size=backend.resumes_on_any_world_size)
    backend.load_state_dict(state)
    backend.load_engine_state(checkpoint / "engine")
    if changed:
        backend.apply_settings(settings())
    stream.load_state_dict(state["stream"])  # a global position: the same on every rank, for any count of ranks
    counters = state["counters"]
    if rng is not None:
        set_rng_state(rng)
    else:  # another number of ranks: the saved per-rank streams have no owner; derive new ones from (seed, step, rank)
        info = distributed.current()
        seed_everything(resharded_seed(cfg.seed, int(counters["step"]), info.rank))
        if is_main:
            print(f"resume: {checkpoint.name} was written by {checkpoint_world_size(checkpoint)} rank(s); this run has "
                  f"{info.world_size}. The prompt stream continues at the same position (no prompt repeated or "
                  "skipped); each rank's random generators are re-seeded from (seed, step, rank), so the sampled "
                  "completions from here on differ from a run that kept the old count (docs/training.md).",
                  file=sys.stderr, flush=True)
    if is_main:
        truncate_logs(run_dir, int(counters["step"]))
    return counters
