"""Real torch.distributed (gloo, 2 processes on CPU).

* The step gradient summed over two ranks equals the single-process gradient on the union of their groups, and the
  independent one-sequence-at-a-time reference (``tests/support/gradient_reference.py``) — with α on and an uneven split of
  informative groups (rank 0 holds two, rank 1 one plus the zero-variance group). Gradients are compared *before*
  the optimizer: AdamW's first step is about lr·sign(g) and would hide any uniform scale error.
* The β_th collection loop stops on the global valid fraction and assembles each rank's update correctly when
  informative groups are spread unevenly over ranks and attempts (a scripted sampler, no model).
* The CLI under torchrun.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support import FIXTURE_TASKS
from support.gradient_reference import (
    gpg_advantages,
    group_centred,
    make_groups,
    make_trainer,
    reference_gradient,
    reference_loss_gradient,
    relative_error,
    trainer_gradient,
    whitened,
    zscore_advantages,
)

TOL = 1e-5  # measured ~4e-7 between the summed and the single-process gradient


def _init(rank: int, world: int, init_file: str) -> None:
    os.environ.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)


def _gradient_worker(rank: int, world: int, init_file: str, model_dir: str, out: str, algo: str) -> None:
    _init(rank, world, init_file)
    try:
        trainer = make_trainer(model_dir, f"{out}/dist", algo)
        groups = make_groups(trainer, [2 * rank, 2 * rank + 1])
        counts = trainer.advantages(groups)
        torch.save({"counts": vars(counts).copy(), "grad": trainer_gradient(trainer, groups)},
                   f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.parametrize("algo", ["gpg", "grpo"])
def test_two_ranks_sum_to_the_single_process_gradient(tiny_dirs, tmp_path, algo):
    model_dir = str(tiny_dirs["qwen2_vl"])
    mp.spawn(_gradient_worker, args=(2, str(tmp_path / "init"), model_dir, str(tmp_path), algo), nprocs=2, join=True)
    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    for k in rank0["grad"]:
        assert torch.equal(rank0["grad"][k], rank1["grad"][k]), f"ranks hold different gradients at {k}"

    single_trainer = make_trainer(model_dir, str(tmp_path / "single"), algo)
    groups = make_groups(single_trainer, [0, 1, 2, 3])
    single = trainer_gradient(single_trainer, groups)
    assert relative_error(rank0["grad"], single) < TOL
    if algo == "gpg":
        want = reference_gradient(single_trainer, groups, [gpg_advantages(g.rewards) for g in groups], alpha=16 / 12,
                                  aggregation="seq_mean_token_mean")
    else:
        want = reference_gradient(single_trainer, groups, [zscore_advantages(g.rewards) for g in groups], alpha=1.0,
                                  aggregation="seq_mean_token_mean")
    assert relative_error(rank0["grad"], want) < TOL
    for r in (rank0, rank1):  # B, M and tokens are global on every rank
        assert r["counts"]["num_samples"] == 16 and r["counts"]["num_zero_variance"] == 4
        assert r["counts"]["alpha"] == (16 / 12 if algo == "gpg" else 1.0)
    assert rank0["counts"] == rank1["counts"]


def _split_worker(rank: int, world: int, init_file: str, model_dir: str, out: str, algo: str, split) -> None:
    _init(rank, world, init_file)
    try:
        trainer = make_trainer(model_dir, f"{out}/dist", algo)
        groups = make_groups(trainer, split[rank])
        counts = trainer.advantages(groups)
        torch.save({"counts": vars(counts).copy(), "grad": trainer_gradient(trainer, groups),
                    "advantages": [g.advantages for g in groups]}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.parametrize(("algo", "split"), [
    ("reinforce_pp", [[0, 1], [2, 3]]),
    ("reinforce_pp_baseline", [[0, 1], [2, 3]]),
    ("reinforce_pp", [[0, 1, 2, 3], []]),  # a rank without groups still joins the moments' all-reduce
])
def test_reinforce_pp_whitens_with_the_statistics_of_all_ranks(tiny_dirs, tmp_path, algo, split):
    """REINFORCE++ over two ranks: the advantages and the summed gradient equal one process on the union of the
    groups, and the reference whitened over every token of all four groups. Per-rank statistics would give rank 0
    the moments of [[1, 0, 0, 1], [0, 1, 1, 1]] alone (checked: normalising per rank fails this test)."""
    model_dir = str(tiny_dirs["qwen2_vl"])
    mp.spawn(_split_worker, args=(2, str(tmp_path / "init"), model_dir, str(tmp_path), algo, split), nprocs=2,
             join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    single_trainer = make_trainer(model_dir, str(tmp_path / "single"), algo)
    groups = make_groups(single_trainer, [0, 1, 2, 3])
    single = trainer_gradient(single_trainer, groups)
    flat = [a for r in ranks for adv in r["advantages"] for a in adv]
    assert flat == pytest.approx([a for g in groups for a in g.advantages], abs=1e-12)
    assert relative_error(ranks[0]["grad"], single) < TOL and relative_error(ranks[1]["grad"], single) < TOL
    values = [g.rewards if algo == "reinforce_pp" else group_centred(g.rewards) for g in groups]
    advs = whitened(values, [[len(c) for c in g.completion_ids] for g in groups])
    want = reference_loss_gradient(single_trainer, groups, advs, loss="clipped_ratio", aggregation="token_mean")
    assert relative_error(ranks[0]["grad"], want) < TOL
    assert ranks[0]["counts"] == ranks[1]["counts"] and ranks[0]["counts"]["alpha"] == 1.0


# ---- the β_th collection loop with a scripted sampler ----------------------------------------------------------------

# Per rank and attempt: which of the two sampled groups are informative ("V") or zero-variance ("Z").
SCRIPT = {0: ["ZZ", "VZ", "VV"], 1: ["VV", "VZ", "ZZ"]}


def _scripted_sampler(rank: int):
    from mmgpg.rollout.collect import Group
    from mmgpg.task import Example

    def sample(attempt: int):
        out = []
        for j, kind in enumerate(SCRIPT[rank][attempt]):
            r = [1.0, 1.0] if kind == "Z" else [1.0, 0.0]
            out.append(Group(Example(f"r{rank}-a{attempt}-{j}{kind}", [], "", None), [[1], [2]], ["", ""], r, {},
                             attempt, kind == "Z"))
        return out

    return sample


def _collect_worker(rank: int, world: int, init_file: str, out: str, min_valid: float, max_attempts: int) -> None:
    from mmgpg.rollout.collect import collect_groups

    _init(rank, world, init_file)
    try:
        got = collect_groups(_scripted_sampler(rank), 2, min_valid_fraction=min_valid, max_attempts=max_attempts)
        Path(f"{out}/rank{rank}.json").write_text(json.dumps({
            "update": [g.example.id for g in got.update], "generated": [g.example.id for g in got.generated],
            "in_update": [g.example.id for g in got.generated if g.in_update], "attempts": got.attempts,
            "dropped": got.dropped_valid_groups}))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.parametrize(("min_valid", "max_attempts", "expected"), [
    # After attempt 0 the update would hold 0 + 2 of 4 informative groups (0.5 < 0.75); after attempt 1, 1 + 2 = 3
    # (0.75): stop. Rank 0's update: its one informative group, then the earliest zero-variance filler; rank 1 keeps
    # its two attempt-0 groups and drops the informative one of attempt 1.
    (0.75, 5, {0: (["r0-a1-0V", "r0-a0-0Z"], 0), 1: (["r1-a0-0V", "r1-a0-1V"], 1), "attempts": 2}),
    # The cap: one attempt only, although 0.5 < 0.75.
    (0.75, 1, {0: (["r0-a0-0Z", "r0-a0-1Z"], 0), 1: (["r1-a0-0V", "r1-a0-1V"], 0), "attempts": 1}),
    # β_th = 1 needs all four: rank 0 reaches two informative groups only at attempt 2.
    (1.0, 5, {0: (["r0-a1-0V", "r0-a2-0V"], 1), 1: (["r1-a0-0V", "r1-a0-1V"], 1), "attempts": 3}),
])
def test_collection_stops_on_the_global_valid_fraction(tmp_path, min_valid, max_attempts, expected):
    mp.spawn(_collect_worker, args=(2, str(tmp_path / "init"), str(tmp_path), min_valid, max_attempts), nprocs=2,
             join=True)
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["attempts"] == expected["attempts"]
        assert len(got["generated"]) == 2 * expected["attempts"]
        assert (got["update"], got["dropped"]) == expected[rank]
        assert sorted(got["in_update"]) == sorted(got["update"])


def _finish_worker(rank: int, world: int, init_file: str, out: str) -> None:
    from mmgpg import distributed

    _init(rank, world, init_file)
    if rank == 0:  # rank 0 still writes (as `mmgpg eval`'s rank 0 does) while rank 1 is done
        import time

        time.sleep(1.0)
        Path(out, "written").write_text("x")
    distributed.finish()
    assert not dist.is_initialized()
    Path(out, f"left{rank}").write_text(str(Path(out, "written").exists()))


@pytest.mark.distributed
def test_finish_lets_no_rank_leave_before_the_others(tmp_path):
    """`distributed.finish` (end of every command): a barrier, then the group is destroyed, so no rank exits while
    another still works (a rank leaving with the gloo group alive aborted in CI after the eval had been written)."""
    mp.spawn(_finish_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    assert [(tmp_path / f"left{r}").read_text() for r in (0, 1)] == ["True", "True"]


@pytest.mark.distributed
def test_mmgpg_train_under_torchrun(tmp_path):
    """The CLI itself under `torchrun --nproc_per_node 2` (gloo): both ranks generate, rank 0 writes the logs."""
    fixtures = FIXTURE_TASKS
    run = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "mmgpg", "train", f"task={fixtures}:ParityShapes", "model=tiny", "rollout.group_size=4",
           "rollout.max_new_tokens=12", "train.prompts_per_step=4", "train.max_steps=2", "train.progress=false",
           "train.learning_rate=1e-3", "train.eval_every=2", "train.eval_limit=5", f"output_dir={run}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [m for m in metrics if "eval/num_samples" in m]
    # the evaluations' batches are split over the two ranks and gathered: every item is judged once
    assert [m["step"] for m in evals] == [0, 2] and all(m["eval/num_samples"] == 5 for m in evals)
    metrics = [m for m in metrics if m["step"] > 0]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["gpg/num_samples"] == 16 for m in metrics)
    records = [json.loads(x) for x in (run / "prompt_success.jsonl").read_text().splitlines()]
    assert {r["rank"] for r in records} == {0, 1}
    for step in (1, 2):  # each rank assembles exactly prompts_per_step / 2 = 2 groups into the update
        for rank in (0, 1):
            assert sum(r["in_update"] for r in records if r["step"] == step and r["rank"] == rank) == 2
    done = json.loads((run / "checkpoints" / "step-00000002" / "COMPLETE").read_text())
    assert done["world_size"] == 2
    assert (run / "checkpoints" / "step-00000002" / "rng_rank1.pt").exists()


@pytest.mark.distributed
@pytest.mark.parametrize("sampling", [pytest.param([], marks=pytest.mark.slow), ["--samples", "3", "--temperature", "1.0"]],
                         ids=["greedy", "sampled"])  # greedy (the simpler path): --runslow
def test_mmgpg_eval_under_torchrun_equals_one_process(tmp_path, sampling):
    """`mmgpg eval` under torchrun splits the items' batches over the ranks and gathers the judgements: the same
    predictions.jsonl (same order, same outputs) and metrics as one process. Sampled (HF engine): each batch is
    seeded by its index, so the samples do not depend on the world size either."""
    args = ["-m", "mmgpg", "eval", "--task", f"{FIXTURE_TASKS}:ParityShapes", "--ckpt", "tiny", "--limit", "7",
            "--batch-size", "2", "--max-new-tokens", "8", "--split", "test", *sampling]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, *args, "--output", str(tmp_path / "one")], capture_output=True, text=True,
                         timeout=600, env=env)
    assert one.returncode == 0, one.stdout + one.stderr
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          *args, "--output", str(tmp_path / "two")], capture_output=True, text=True, timeout=600, env=env)
    assert two.returncode == 0, two.stdout + two.stderr
    a, b = ((tmp_path / d / "predictions.jsonl").read_text() for d in ("one", "two"))
    assert a == b and len(a.splitlines()) == 7 * (3 if sampling else 1)
    ma, mb = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("one", "two"))
    assert ma["metrics"] == mb["metrics"] and ma["counts"] == mb["counts"]
    assert two.stdout.count("wrote ") == 1  # rank 0 writes and prints


def test_gradient_checkpointing_gives_the_same_gradient(tiny_dirs, tmp_path):
    """train.gradient_checkpointing recomputes activations in backward; the gradient must not change."""
    model_dir = str(tiny_dirs["qwen2_vl"])
    plain = make_trainer(model_dir, str(tmp_path / "plain"))
    ckpt = make_trainer(model_dir, str(tmp_path / "ckpt"), "gpg", "train.gradient_checkpointing=true")
    a = trainer_gradient(plain, make_groups(plain, [0, 1, 2, 3]))
    b = trainer_gradient(ckpt, make_groups(ckpt, [0, 1, 2, 3]))
    assert relative_error(b, a) < TOL


def _lora_init_worker(rank: int, world: int, init_file: str, model_dir: str, out: str) -> None:
    _init(rank, world, init_file)
    try:
        trainer = make_trainer(model_dir, f"{out}/dist", "gpg", "model.lora.rank=4")
        torch.save({n: p.detach().clone() for n, p in trainer.policy.peft.named_parameters() if p.requires_grad},
                   f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_a_fresh_lora_adapter_is_the_same_on_every_rank(tiny_dirs, tmp_path):
    """The adapter's random A is drawn at start-up, after each rank seeded its own stream (seed + rank, for
    sampling); the plain backend never broadcasts weights, so unless loading draws from ``seed`` itself the ranks
    would train different adapters (DeepSpeed's initialize broadcasts rank 0's and hid it there)."""
    mp.spawn(_lora_init_worker, args=(2, str(tmp_path / "init"), str(tiny_dirs["qwen2_vl"]), str(tmp_path)), nprocs=2,
             join=True)
    rank0, rank1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert rank0.keys() == rank1.keys() and any("lora_A" in k for k in rank0)
    assert any(float(v.abs().max()) > 0 for k, v in rank0.items() if "lora_A" in k)
    for k in rank0:
        assert torch.equal(rank0[k], rank1[k]), f"the ranks' fresh adapters differ at {k}"
