"""A real multi-node launch on one machine: two torchrun launchers (``--nnodes 2 --nproc_per_node 1 --node_rank
0/1``, c10d rendezvous on 127.0.0.1) train the tiny model for 2 steps, and the update equals the single-node
2-process run (``torchrun --standalone --nproc_per_node 2``) exactly: the same metrics and the same saved weights.
Both are 2 gloo ranks; only the launch differs, so any difference is the launch's (rank assignment, environment,
rendezvous), not arithmetic. The ``deepspeed --hostfile`` launcher needs pdsh/ssh to a second host, which a CI
machine does not have (docs/distributed.md)."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file
from support import FIXTURE_TASKS, comparable_run, run_mmgpg, run_mmgpg_nodes

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
TRAIN = ["train", f"task={FIXTURE_TASKS}:ParityShapes", "model=tiny", "rollout.group_size=4",
         "rollout.max_new_tokens=8", "train.prompts_per_step=4", "train.micro_batch_prompts=1", "train.max_steps=2",
         "train.progress=false", "train.tensorboard=false", "train.learning_rate=1e-3"]


def final_weights(run) -> dict[str, torch.Tensor]:
    [policy] = list((run / "checkpoints").glob("step-00000002/policy"))
    out = {}
    for f in sorted(policy.glob("*.safetensors")):
        out.update(load_file(f))
    assert out, f"no safetensors in {policy}"
    return out


@pytest.mark.distributed
def test_two_nodes_equal_one_node_with_two_processes(tmp_path):
    nodes = tmp_path / "nodes"
    launchers = run_mmgpg_nodes(*TRAIN, f"output_dir={nodes}", nodes=2, env=ENV, timeout=900)
    assert len(launchers) == 2
    one = tmp_path / "one_node"
    run_mmgpg(*TRAIN, f"output_dir={one}", ranks=2, env=ENV, timeout=900)
    got, want = comparable_run(nodes), comparable_run(one)
    assert [m["step"] for m in got] == [1, 2] and all(m["gpg/num_samples"] == 16 for m in got)
    assert got == want
    a, b = final_weights(nodes), final_weights(one)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    import json

    done = json.loads((nodes / "checkpoints" / "step-00000002" / "COMPLETE").read_text())
    assert done["world_size"] == 2
    assert {p.name for p in (nodes / "checkpoints" / "step-00000002").glob("rng_rank*.pt")} == {"rng_rank0.pt",
                                                                                                "rng_rank1.pt"}
