"""The DeepSpeed backend with real DeepSpeed (gloo, 2 processes on CPU).

* ZeRO-2 and ZeRO-3: the step gradient (full, reduced, before the optimizer step) equals the plain backend's
  single-process gradient on the union of the groups and the independent one-sequence-at-a-time reference
  (``tests/support/gradient_reference.py``), with α on and the uneven split of test_distributed (rank 0 forwards two
  informative groups, rank 1 one plus a zero-weight padding micro-batch).
* The configuration: the DeepSpeed keys' checks and the merge of a user JSON (conflicts name both sources).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support import FIXTURE_TASKS, comparable_run
from support.gradient_reference import (
    ALPHA,
    gpg_advantages,
    make_groups,
    make_trainer,
    reference_gradient,
    relative_error,
    trainer_gradient,
    zscore_advantages,
)

from mmgpg.backends import deepspeed_config
from mmgpg.config import ConfigError, resolve

HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(not HAVE_DEEPSPEED, reason="deepspeed is not installed "
                                     "(pip install 'mmgpg[deepspeed]')")
TOL = 1e-5  # measured ~2e-7 (ZeRO-3) and ~4e-8 (ZeRO-2) against the single-process plain gradient


# A rank that dies by one of these signals crashed in native code (a Python exception arrives as
# ProcessRaisedException instead). CI saw one such death in ~1000 DeepSpeed launches: rank 1 aborted with "terminate
# called without an active exception" ~2 s after DeepSpeed loaded its shm op, before any step; 14 reruns under load
# passed. spawn retries such a launch once, with a warning in the test summary, so the rare native abort does not
# fail CI while a second crash, a Python exception, a wrong result or a hang still fails the test.
NATIVE_CRASH = {"SIGABRT", "SIGSEGV", "SIGBUS"}


def _launch(fn, args, nprocs: int, timeout: float) -> None:
    ctx = mp.spawn(fn, args=args, nprocs=nprocs, join=False)
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"the {nprocs} ranks did not finish within {timeout:.0f} s (a collective one rank never joined?)")


def spawn(fn, args, nprocs: int = 2, timeout: float = float(os.environ.get("MMGPG_SPAWN_TIMEOUT", 420))) -> None:
    """mp.spawn with a deadline: a collective that one rank never joins fails the test instead of hanging it.

    ``args[1]`` is the rendezvous file (every worker here takes ``(world, init_file, ...)``); a retry after a native
    crash (``NATIVE_CRASH``) rendezvouses on a fresh one, since the dead launch's file store may hold stale keys."""
    try:
        _launch(fn, args, nprocs, timeout)
    except mp.ProcessExitedException as e:
        if e.signal_name not in NATIVE_CRASH:
            raise
        warnings.warn(f"rank {e.error_index} died by {e.signal_name} (a native crash); retrying the launch once",
                      stacklevel=2)
        _launch(fn, (args[0], f"{args[1]}-retry", *args[2:]), nprocs, timeout)


def ds_init(rank: int, world: int, init_file: str) -> None:
    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)


def _gradient_worker(rank: int, world: int, init_file: str, model_dir: str, out: str, stage: int, algo: str) -> None:
    ds_init(rank, world, init_file)
    try:
        trainer = make_trainer(model_dir, f"{out}/ds", algo, "train.backend=deepspeed", f"train.zero_stage={stage}")
        groups = make_groups(trainer, [2 * rank, 2 * rank + 1])
        counts = trainer.advantages(groups)
        micro = trainer._micro_batches(groups)
        trainer.compute_gradients(groups, counts)
        grads = trainer.backend.full_gradients()  # collective under ZeRO-3
        reference_partitioned = trainer.reference is not None and all(
            getattr(p, "ds_numel", None) is not None and p.numel() == 0 for p in trainer.reference.model.parameters())
        from mmgpg.rollout.collect import padding_counts

        torch.save({"grad": grads, "micro": [w for _, _, w in micro], "alpha": counts.alpha,
                    "reference_partitioned": reference_partitioned,
                    "positions": trainer.padding_positions(micro),  # what update/padding_fraction sums over ranks
                    "each": [padding_counts(r, packed=trainer.packed) for r, _, _ in micro]}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@needs_deepspeed
@pytest.mark.distributed
@pytest.mark.parametrize(("stage", "algo"), [(2, "gpg"), (3, "gpg"), (3, "grpo")])
def test_zero_gradient_equals_plain_and_reference(tiny_dirs, tmp_path, stage, algo):
    """GRPO (kl_coef = 0.04) adds the reference model, partitioned under ZeRO-3, and forwards the zero-variance group
    too (its KL term); the k3 KL gradient vanishes at the reference weights, so the reference gradient has the same
    form with z-scored advantages and α = 1."""
    model_dir = str(tiny_dirs["qwen2_vl"])
    spawn(_gradient_worker, (2, str(tmp_path / "init"), model_dir, str(tmp_path), stage, algo))
    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    if algo == "gpg":
        # The uneven split: rank 1 forwards one informative group and pads with one zero-weight micro-batch.
        assert rank0["micro"] == [1.0, 1.0] and rank1["micro"] == [1.0, 0.0]
        assert rank0["alpha"] == rank1["alpha"] == ALPHA
        # update/padding_fraction counts the positions of real micro-batches only, not the filler's (which has some)
        assert rank1["each"][1][0] > 0 and rank1["positions"] == rank1["each"][0]
    else:
        assert rank0["micro"] == rank1["micro"] == [1.0, 1.0] and rank0["alpha"] == 1.0
        assert rank0["reference_partitioned"] and rank1["reference_partitioned"]
    for r in (rank0, rank1):
        if 0.0 not in r["micro"]:
            assert r["positions"] == tuple(map(sum, zip(*r["each"])))
    for k in rank0["grad"]:
        assert torch.equal(rank0["grad"][k], rank1["grad"][k]), f"ranks hold different gradients at {k}"

    single = make_trainer(model_dir, str(tmp_path / "single"), algo)  # the plain backend, one process
    groups = make_groups(single, [0, 1, 2, 3])
    plain = trainer_gradient(single, groups)
    assert relative_error(rank0["grad"], plain) < TOL
    if algo == "gpg":
        want = reference_gradient(single, groups, [gpg_advantages(g.rewards) for g in groups], alpha=ALPHA,
                                  aggregation="seq_mean_token_mean")
    else:
        want = reference_gradient(single, groups, [zscore_advantages(g.rewards) for g in groups], alpha=1.0,
                                  aggregation="seq_mean_token_mean")
    assert relative_error(rank0["grad"], want) < TOL


def _full_weights_worker(rank: int, world: int, init_file: str, model_dir: str, out: str, stage: int) -> None:
    ds_init(rank, world, init_file)
    try:
        trainer = make_trainer(model_dir, f"{out}/ds", "gpg", "train.backend=deepspeed", f"train.zero_stage={stage}")
        # collective under ZeRO-3: every rank iterates. Each yielded copy is released once used, as a bucketed vLLM
        # sync releases it, so the allocator may hand its address to the next gathered copy: that must not make the
        # next tensor look like a tied one and vanish.
        weights = {name: t.clone() for name, t in trainer.backend.full_weights(torch.bfloat16)}
        torch.save(weights, f"{out}/weights{rank}.pt")
    finally:
        dist.destroy_process_group()


@needs_deepspeed
@pytest.mark.distributed
@pytest.mark.parametrize("stage", [2, 3])
def test_full_weights_are_the_whole_model_in_the_engine_dtype(tiny_dirs, tmp_path, stage):
    """What a rollout engine with its own copy (vLLM) is synced with: under ZeRO-3 the parameters are empty
    placeholders outside a gather, so full_weights must gather them (module by module); the result is every tensor
    of the model's own state dict (tied weights once), full-sized, equal to the loaded weights, in the dtype asked."""
    from transformers import AutoModelForImageTextToText

    from mmgpg.models.save import unique_tensors

    model_dir = str(tiny_dirs["qwen2_vl"])
    spawn(_full_weights_worker, (2, str(tmp_path / "init"), model_dir, str(tmp_path), stage))
    want = dict(unique_tensors(AutoModelForImageTextToText.from_pretrained(model_dir).state_dict(), torch.bfloat16))
    for rank in (0, 1):
        got = torch.load(tmp_path / f"weights{rank}.pt")
        assert got.keys() == want.keys(), (stage, sorted(set(want) ^ set(got))[:5])
        for k, v in want.items():
            assert got[k].shape == v.shape and got[k].dtype == v.dtype, (k, got[k].shape, v.shape)
            assert torch.equal(got[k], v), k


# ---- LoRA under ZeRO-2 and ZeRO-3 ------------------------------------------------------------------------------------

LORA = ("model.lora.rank=4", "model.lora.trainable_modules=[lm_head]", "train.learning_rate=1e-3")
"""Adapters on every projection plus a fully trained head: the head is a PEFT ModulesToSaveWrapper, whose trained
copy ZeRO-3 must gather for the chunked log-probs."""


def _lora_run(trainer, groups):
    """The step gradient, then two steps (the first with that gradient, the second a whole update), then the
    adapter's tensors and the merged full weights: the same calls on the plain and the DeepSpeed backend."""
    counts = trainer.advantages(groups)
    trainer.compute_gradients(groups, counts)
    backend = trainer.backend
    if hasattr(backend, "full_gradients"):
        grads = backend.full_gradients()  # collective under ZeRO-3
    else:
        grads = {n: p.grad.clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}
    assert backend.step().stepped
    trainer.update(groups, trainer.advantages(groups))
    peft = trainer.policy.peft
    adapter = backend.trainable_state_dict(peft)  # collective under ZeRO-3
    if adapter is None:
        adapter = {n: p.detach().clone() for n, p in peft.named_parameters() if p.requires_grad}
    return {"grad": grads, "adapter": adapter, "merged": dict(backend.full_weights(None))}


def _lora_worker(rank: int, world: int, init_file: str, model_dir: str, out: str, stage: int, algo: str) -> None:
    ds_init(rank, world, init_file)
    try:
        trainer = make_trainer(model_dir, f"{out}/ds", algo, *LORA, "train.backend=deepspeed",
                               f"train.zero_stage={stage}")
        torch.save(_lora_run(trainer, make_groups(trainer, [2 * rank, 2 * rank + 1])), f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@needs_deepspeed
@pytest.mark.distributed
@pytest.mark.parametrize(("stage", "algo"), [(2, "gpg"), (3, "grpo")])
def test_lora_on_zero_equals_lora_on_plain(tiny_dirs, tmp_path, stage, algo):
    """LoRA (adapters + a trained lm_head) on 2 DeepSpeed ranks against LoRA on the plain backend in one process
    with all four groups: the step gradient (before the optimizer), then after two steps the adapter (what
    ``adapter/`` saves; gathered under ZeRO-3) and the merged full weights (what ``policy/`` saves and a rollout
    engine loads; each LoRA layer gathered and merged under ZeRO-3). GRPO: the reference is the policy with its
    adapter switched off, and its KL term is in the second step's gradient."""
    model_dir = str(tiny_dirs["qwen2_vl"])
    spawn(_lora_worker, (2, str(tmp_path / "init"), model_dir, str(tmp_path), stage, algo))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for part in ("grad", "adapter", "merged"):
        for k in ranks[0][part]:
            assert torch.equal(ranks[0][part][k], ranks[1][part][k]), f"ranks hold different {part} at {k}"
    single = make_trainer(model_dir, str(tmp_path / "plain"), algo, *LORA)  # the plain backend, one process
    plain = _lora_run(single, make_groups(single, [0, 1, 2, 3]))
    got = ranks[0]
    assert any("lora_B" in k for k in got["grad"]) and any("modules_to_save" in k for k in got["grad"])
    assert relative_error(got["grad"], plain["grad"]) < TOL
    assert got["adapter"].keys() == plain["adapter"].keys()
    # AdamW's first steps move every element by about the learning rate (1e-3) whatever its gradient's size, so an
    # element whose gradient is near 0 carries the gradients' ~1e-7 relative difference into ~1e-6 (measured 1.7e-6
    # on one of 2048 elements under ZeRO-3): the tolerance is 1% of one step.
    moved = 0
    for k, v in plain["adapter"].items():
        torch.testing.assert_close(got["adapter"][k], v, atol=1e-5, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
        moved += "lora_B" in k and float(v.abs().max()) > 0
    assert moved, "no lora_B left zero: the steps did not train the adapter"
    assert got["merged"].keys() == plain["merged"].keys()
    assert not any("lora_" in k or "base_layer" in k or "modules_to_save" in k for k in got["merged"])
    for k, v in plain["merged"].items():
        assert got["merged"][k].shape == v.shape, (k, got["merged"][k].shape, v.shape)
        torch.testing.assert_close(got["merged"][k], v, atol=1e-5, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


def _nonfinite_worker(rank: int, world: int, init_file: str, model_dir: str, out: str, stage: int) -> None:
    from deepspeed.utils import safe_get_full_fp32_param

    ds_init(rank, world, init_file)
    try:
        trainer = make_trainer(model_dir, f"{out}/ds", "gpg", "train.backend=deepspeed", f"train.zero_stage={stage}",
                               "train.lr_scheduler=linear", "train.max_steps=4")
        params = list(trainer.policy.model.parameters())

        def full(p):  # ZeRO-1/2/3: the optimizer's fp32 copy (collective under ZeRO-3); stage 0: the parameter
            f = safe_get_full_fp32_param(p)
            return (p if f is None else f).detach().clone()

        before = [full(p) for p in params]
        groups = make_groups(trainer, [2 * rank, 2 * rank + 1])
        counts = trainer.advantages(groups)
        if rank == 0:
            groups[0].advantages[0] = float("nan")  # a NaN loss on one rank only
        stats = trainer.update(groups, counts)
        after = [full(p) for p in params]
        torch.save({"grad_norm": stats["grad_norm"], "nonfinite": trainer.state.nonfinite_steps,
                    "steps": trainer.state.optimizer_steps, "lr": trainer.backend.learning_rate(),
                    "unchanged": all(torch.equal(a, b) for a, b in zip(before, after))}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@needs_deepspeed
@pytest.mark.distributed
@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_nonfinite_step_is_skipped_like_plain(tiny_dirs, tmp_path, stage):
    """As the plain backend (test_trainer.py): the step is skipped and counted, no weight moves, the schedule
    advances. ZeRO-2/3 detect it from the gradient norm themselves; at stage 0 the backend checks the loss."""
    spawn(_nonfinite_worker, (2, str(tmp_path / "init"), str(tiny_dirs["qwen2_vl"]), str(tmp_path), stage))
    for rank in (0, 1):
        r = torch.load(tmp_path / f"rank{rank}.pt")
        assert r["grad_norm"] != r["grad_norm"] or r["grad_norm"] == float("inf")
        assert (r["nonfinite"], r["steps"]) == (1, 0)
        assert r["unchanged"]
        assert r["lr"] == pytest.approx(1e-4 * 3 / 4)


# ---- configuration -----------------------------------------------------------------------------------------------


def _problems(*overrides: str) -> list[str]:
    try:
        resolve(["model=tiny", *overrides])
    except ConfigError as err:
        return [str(p) for p in err.problems]
    return []


def test_deepspeed_keys_are_checked(tmp_path):
    assert _problems("train.backend=deepspeed", "train.zero_stage=3", "train.offload_params=true") == [] \
        or not HAVE_DEEPSPEED
    [p] = _problems("train.backend=deepspeed", "train.zero_stage=4")
    assert p.startswith("train.zero_stage: got 4.")
    [p] = _problems("train.backend=deepspeed", "train.zero_stage=2", "train.offload_params=true")
    assert p.startswith("train.offload_params") and "train.zero_stage=3" in p
    [p] = _problems("train.backend=deepspeed", "train.zero_stage=0", "train.offload_optimizer=true")
    assert p.startswith("train.offload_optimizer") and "ZeRO stage 1 or more" in p
    [p] = _problems("train.offload_optimizer=true")  # plain backend
    assert "only applies to train.backend=deepspeed" in p
    [p] = _problems("train.backend=deepspeed", f"train.deepspeed_config={tmp_path / 'missing.json'}")
    assert p.startswith("train.deepspeed_config") and "does not exist" in p


def test_missing_deepspeed_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(deepspeed_config.importlib.util, "find_spec",
                        lambda name, *a: None if name == "deepspeed" else real(name, *a))
    [p] = _problems("train.backend=deepspeed")
    assert "pip install 'mmgpg[deepspeed]'" in p and p.startswith("train.backend")


def test_user_json_merges_and_conflicts_name_both_sources(tmp_path):
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"zero_optimization": {"stage": "auto", "reduce_bucket_size": 5e7}, "gradient_clipping": 1.0}))
    derived, sources = deepspeed_config.derive(3, False, False, 1.0, bf16=False)
    merged = deepspeed_config.merge(derived, sources, deepspeed_config.read_user_config(str(ok)), str(ok))
    assert merged["zero_optimization"] == {"stage": 3, "reduce_bucket_size": 5e7}
    assert merged["gradient_clipping"] == 1.0
    assert _problems("train.backend=deepspeed", "train.zero_stage=3", f"train.deepspeed_config={ok}") == [] \
        or not HAVE_DEEPSPEED

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"zero_optimization": {"stage": 2}, "gradient_clipping": 0.5,
                               "optimizer": {"type": "AdamW"}}))
    problems = _problems("train.backend=deepspeed", "train.zero_stage=3", f"train.deepspeed_config={bad}")
    assert len(problems) == 3
    stage = next(p for p in problems if "zero_optimization.stage" in p)
    assert str(bad) in stage and "train.zero_stage" in stage and "= 3" in stage
    clip = next(p for p in problems if "gradient_clipping" in p)
    assert "train.max_grad_norm" in clip
    assert any("optimizer" in p and "mmgpg builds AdamW" in p for p in problems)


# ---- checkpoints under ZeRO-3 ------------------------------------------------------------------------------------

GREEDY_PROMPTS = 3


def _checkpoint_worker(rank: int, world: int, init_file: str, model_dir: str, out: str) -> None:
    from mmgpg.rollout import Sampling

    ds_init(rank, world, init_file)
    try:
        trainer = make_trainer(model_dir, f"{out}/run", "gpg", "train.backend=deepspeed", "train.zero_stage=3",
                               "train.learning_rate=1e-2")
        groups = make_groups(trainer, [2 * rank, 2 * rank + 1])
        trainer.update(groups, trainer.advantages(groups))  # one real step: the weights leave their initial values
        checkpoint = trainer.save()
        examples = [trainer.dataset[i] for i in range(GREEDY_PROMPTS)]
        with trainer.backend.generation_context():  # every rank gathers; rank 0 generates with the live model
            if rank == 0:
                batch = trainer.engine.generate([trainer.task.prompt(e) for e in examples], 1,
                                                Sampling(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=12))
                torch.save({"ids": batch.completion_ids, "mask": batch.completion_mask, "checkpoint": str(checkpoint)},
                           f"{out}/live.pt")
    finally:
        dist.destroy_process_group()


@needs_deepspeed
@pytest.mark.distributed
def test_zero3_checkpoint_policy_loads_in_transformers_and_answers_like_the_live_model(tiny_dirs, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from mmgpg.models.qwen_vl import QwenVLPolicy
    from mmgpg.rundir import verify_checkpoint

    model_dir = str(tiny_dirs["qwen2_vl"])
    spawn(_checkpoint_worker, (2, str(tmp_path / "init"), model_dir, str(tmp_path)))
    live = torch.load(tmp_path / "live.pt")
    checkpoint = Path(live["checkpoint"])
    assert verify_checkpoint(checkpoint)["world_size"] == 2
    assert (checkpoint / "engine").is_dir()  # DeepSpeed's partitioned optimizer state beside policy/
    # ZeRO-3 on 2 ranks: per-rank model states and optimizer partitions, each one checked (rundir.engine_files)
    from mmgpg.typed import CheckpointError

    for name in ("zero_pp_rank_1_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"):
        damaged = tmp_path / f"damaged-{name}"
        shutil.copytree(checkpoint, damaged)
        (damaged / "engine" / "state" / name).unlink()
        with pytest.raises(CheckpointError, match=f"engine/state/{name} is missing"):
            verify_checkpoint(damaged)

    model = AutoModelForImageTextToText.from_pretrained(checkpoint / "policy", dtype=torch.float32)
    initial = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    moved = [n for (n, p), q in zip(model.named_parameters(), initial.parameters()) if not torch.equal(p, q)]
    assert moved, "the saved weights equal the initial ones: the step or the ZeRO-3 gather did not happen"
    policy = QwenVLPolicy(model, AutoProcessor.from_pretrained(checkpoint / "policy"), min_pixels=3136, max_pixels=12544)
    trainer_task = make_trainer(model_dir, str(tmp_path / "task-only"), "gpg")
    examples = [trainer_task.dataset[i] for i in range(GREEDY_PROMPTS)]
    batch = policy.generate(policy.encode_prompts([trainer_task.task.prompt(e) for e in examples]), 1,
                            max_new_tokens=12, temperature=0.0)
    assert torch.equal(batch.completion_mask, live["mask"])
    assert torch.equal(batch.completion_ids.masked_fill(~batch.completion_mask, 0),
                       live["ids"].masked_fill(~live["mask"], 0))


# ---- end to end under torchrun: kill -9 after a checkpoint, resume, same run ---------------------------------------

FIXTURES = FIXTURE_TASKS
DS_TRAIN = ["train", f"task={FIXTURES}:ParityShapes", "model=tiny", "rollout.group_size=4", "rollout.max_new_tokens=12",
            "train.prompts_per_step=4", "train.micro_batch_prompts=1", "train.learning_rate=1e-3",
            "train.progress=false", "train.tensorboard=false", "train.max_steps=4", "train.save_every=1",
            "train.keep_last=10", "algo.min_valid_fraction=0.5", "algo.max_resample_attempts=3",
            "train.backend=deepspeed", "train.zero_stage=3"]


def _torchrun(*args: str, nproc: int = 2):
    import sys

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "mmgpg", *args]
    return cmd, {**os.environ, "OMP_NUM_THREADS": "1"}


_comparable = comparable_run


@needs_deepspeed
@pytest.mark.slow
@pytest.mark.distributed
def test_zero3_torchrun_resume_after_sigkill_is_exact(tmp_path):
    import subprocess

    from safetensors.torch import load_file

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    cmd, env = _torchrun(*DS_TRAIN, f"output_dir={straight}")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

    cmd, env = _torchrun(*DS_TRAIN, f"output_dir={killed}")
    from support.faults_support import kill_after_checkpoint

    kill_after_checkpoint(cmd, killed, env=env, timeout=600, group=True)  # torchrun and both ranks, at once
    assert not (killed / "checkpoints" / "step-00000004").exists()

    cmd, env = _torchrun(*DS_TRAIN, f"output_dir={killed}", "train.resume=true")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ma, mb = _comparable(straight), _comparable(killed)
    assert [m["step"] for m in mb] == [1, 2, 3, 4]
    for x, y in zip(ma, mb):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-6), (x["step"], k)
    assert any(m["grad_norm"] > 0 for m in ma), "the run must actually update the policy"
    final = "checkpoints/step-00000004/policy/model.safetensors"
    a, b = load_file(straight / final), load_file(killed / final)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0)

    # Resuming on another number of ranks: tests/integration/test_resume_world_size.py (re-split, equal to plain).


# ---- SFT on the same backend ---------------------------------------------------------------------------------------

SFT = ["sft", "task=shapes", "model=tiny", "model.dtype=float32", "sft.batch_size=4", "sft.learning_rate=1e-3",
       "sft.max_steps=3", "train.eval_limit=2", "rollout.max_new_tokens=8"]


@needs_deepspeed
def test_sft_on_zero3_equals_sft_on_plain(tmp_path):
    import subprocess
    import sys

    from safetensors.torch import load_file

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name, extra in (("plain", []), ("zero3", ["train.backend=deepspeed", "train.zero_stage=3"])):
        proc = subprocess.run([sys.executable, "-m", "mmgpg", *SFT, *extra, f"output_dir={tmp_path / name}"],
                              capture_output=True, text=True, timeout=900, env=env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = {n: [json.loads(x) for x in (tmp_path / n / "metrics.jsonl").read_text().splitlines()]
            for n in ("plain", "zero3")}
    for a, b in zip(rows["plain"], rows["zero3"]):
        assert a["loss/sft"] == pytest.approx(b["loss/sft"], rel=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    a, b = load_file(tmp_path / "plain/final/model.safetensors"), load_file(tmp_path / "zero3/final/model.safetensors")
    assert a.keys() == b.keys()
    initial = {}
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=0)  # measured 1.1e-6; one AdamW step moves ~1e-3
        initial[k] = float(a[k].abs().sum())
    assert all(v > 0 for v in initial.values()), "a gathered tensor came back empty"


@pytest.mark.parametrize("user, key, fix", [
    ({"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": True}}},
     "zero_optimization.offload_optimizer", "train.offload_optimizer=true"),
    ({"zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": "/nvme"}}},
     "zero_optimization.offload_param", "train.offload_params=true"),
    ({"zero_optimization": {"cpu_offload": True}}, "zero_optimization.cpu_offload", "train.offload_optimizer=true"),
    ({"zero_optimization": {"cpu_offload_param": True}}, "zero_optimization.cpu_offload_param",
     "train.offload_params=true"),
    ({"train_batch_size": 64}, "train_batch_size", "train.micro_batch_prompts"),
    ({"amp": {"enabled": True}}, "amp", "model.dtype"),
    ({"zero_optimization": 3}, "zero_optimization", "a JSON object"),
    ({"bf16": True}, "bf16", "a JSON object"),
    ({"gradient_clipping": {"value": 1.0}}, "gradient_clipping", "a single value"),
])
def test_user_json_cannot_turn_on_offload_or_break_what_mmgpg_sets(tmp_path, user, key, fix):
    """Keys that passed the check and then crashed inside DeepSpeed (train_batch_size against mmgpg's batch
    bookkeeping, a section given as a scalar) or changed the run behind mmgpg's keys (offload, which the planner and
    the offload checks never saw; apex AMP): each is refused naming the key and the mmgpg setting to use."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(user))
    problems = _problems("train.backend=deepspeed", "train.zero_stage=3", f"train.deepspeed_config={path}")
    if not HAVE_DEEPSPEED:
        problems = [p for p in problems if "not installed" not in p]
    assert len(problems) == 1, problems
    assert str(path) in problems[0] and f"{key}" in problems[0] and fix in problems[0], problems[0]


def test_user_json_may_tune_offload_that_mmgpg_turned_on(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": True},
                                                      "offload_param": {"device": "none"}},
                                "train_batch_size": "auto"}))
    derived, sources = deepspeed_config.derive(3, True, False, 1.0, bf16=False)
    merged = deepspeed_config.merge(derived, sources, deepspeed_config.read_user_config(str(path)), str(path))
    assert merged["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert merged["zero_optimization"]["offload_param"] == {"device": "none"}  # "none": offload stays off
    assert "train_batch_size" not in merged


def _abort_worker(rank: int, world: int, init_file: str, out: str, crashes: int) -> None:
    """Rank 1 aborts on the first ``crashes`` launches (counted by the rendezvous file's ``-retry`` suffixes)."""
    if rank == 1 and init_file.count("-retry") < crashes:
        os.abort()
    Path(out, f"rank{rank}-{init_file.count('-retry')}").touch()


def test_spawn_retries_one_native_crash_and_fails_on_a_second(tmp_path):
    with pytest.warns(UserWarning, match="SIGABRT"):
        spawn(_abort_worker, (2, str(tmp_path / "init"), str(tmp_path), 1))
    assert (tmp_path / "rank0-1").exists() and (tmp_path / "rank1-1").exists()
    with pytest.raises(mp.ProcessExitedException), pytest.warns(UserWarning):
        spawn(_abort_worker, (2, str(tmp_path / "init"), str(tmp_path), 2))
