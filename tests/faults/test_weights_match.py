"""What is loaded is what the run trained: a policy/ whose tensor names were changed (its header still intact) is an
error, never randomly initialised weights; a LoRA adapter/ must match model.lora (rank, alpha, targets, trained
modules, tensor names), never silently win over it; train.resume_config=new refuses the LoRA changes it cannot apply
instead of recording them; and a run's config.yaml describes the attempt that trained, not one that never did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from support.faults_support import TINY, mmgpg, steps

from mmgpg.config import LoraConfig
from mmgpg.models import lora
from mmgpg.models.load import load_policy
from mmgpg.rundir import verify_checkpoint

PIXELS = dict(dtype="float32", min_pixels=3136, max_pixels=12544, device="cpu")


def _rename_tensor(path: Path, old_part: str, new_part: str) -> tuple[str, str]:
    """Rename the first tensor whose name contains ``old_part`` in a safetensors file; the file stays well-formed."""
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
    tensors = load_file(path)
    old = next(k for k in sorted(tensors) if old_part in k)
    new = old.replace(old_part, new_part)
    tensors[new] = tensors.pop(old)
    save_file(tensors, str(path), metadata=metadata)
    return old, new


# ---- policy/ ------------------------------------------------------------------------------------------------------


def test_a_policy_whose_tensors_were_renamed_is_refused_not_randomly_initialised(tmp_path, checkpoint_copy):
    run = checkpoint_copy(tmp_path)
    newest = run / "checkpoints" / "step-00000002"
    _rename_tensor(newest / "policy" / "model.safetensors", "self_attn.q_proj.weight", "self_attn.q_proj_renamed.weight")
    verify_checkpoint(newest)  # the header is intact: only loading can tell
    with pytest.raises(ValueError) as err:
        load_policy(str(newest / "policy"), **PIXELS)
    message = str(err.value)
    assert "1 parameter(s) missing" in message and "self_attn.q_proj.weight" in message, message
    assert "1 tensor(s) unexpected" in message and "q_proj_renamed.weight" in message, message
    proc = mmgpg("eval", "--task", TINY[1].partition("=")[2], "--ckpt", str(run), "--limit", "1", "--max-new-tokens",
                 "4", "--output", str(tmp_path / "ev"), "model=tiny", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "q_proj_renamed" in proc.stderr and "randomly initialised" in proc.stderr, proc.stderr
    proc = mmgpg("train", *TINY, "train.max_steps=3", "train.resume=true", f"output_dir={run}", check=False)
    assert proc.returncode == 2 and "q_proj_renamed" in proc.stderr and "step-00000002" in proc.stderr, proc.stderr
    assert steps(run) == [1, 2]  # nothing trained on the damaged weights


# ---- adapter/ -----------------------------------------------------------------------------------------------------

LORA = dict(rank=4, alpha=8.0, trainable_modules=["lm_head"])


@pytest.fixture
def saved_adapter(tiny_dirs, tmp_path) -> tuple[Path, dict]:
    """An adapter saved by mmgpg (non-zero B, a trained head copy) and the merged weights it gives."""
    policy = load_policy(str(tiny_dirs["qwen2_vl"]), **PIXELS)
    lora.attach(policy, LoraConfig(**LORA))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    lora.save_adapter(policy, tmp_path / "adapter")
    return tmp_path / "adapter", lora.merged_state_dict(policy.model)


def _attach(tiny_dirs, adapter: Path, **changes):
    policy = load_policy(str(tiny_dirs["qwen2_vl"]), **PIXELS)
    lora.attach(policy, LoraConfig(**{**LORA, **changes}), adapter)
    return policy


def _edit_config(adapter: Path, **fields) -> None:
    path = adapter / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(fields)
    path.write_text(json.dumps(config))


def test_an_intact_adapter_loads_exactly(tiny_dirs, saved_adapter):
    adapter, merged = saved_adapter
    again = lora.merged_state_dict(_attach(tiny_dirs, adapter).model)
    assert again.keys() == merged.keys() and all(torch.equal(again[k], merged[k]) for k in merged)


@pytest.mark.parametrize(("edit", "names"), [
    (lambda a: _edit_config(a, lora_alpha=800.0), ["lora_alpha", "800", "model.lora.alpha", "8"]),
    (lambda a: _edit_config(a, r=8), ["r", "model.lora.rank"]),
    (lambda a: _edit_config(a, target_modules=r"model\.language_model\.layers\.\d+\.(?:self_attn\.q_proj)"),
     ["target_modules", "model.lora.target_modules"]),
    (lambda a: _edit_config(a, modules_to_save=None), ["modules_to_save", "model.lora.trainable_modules"]),
    (lambda a: _rename_tensor(a / "adapter_model.safetensors", "lora_B", "lora_Q"), ["lora_B", "lora_Q"]),
    (lambda a: _rename_tensor(a / "adapter_model.safetensors", "lm_head", "lm_tail"), ["lm_head", "lm_tail"]),
])
def test_an_adapter_that_does_not_match_model_lora_is_refused(tiny_dirs, saved_adapter, edit, names):
    adapter, _ = saved_adapter
    edit(adapter)
    with pytest.raises(ValueError, match="adapter") as err:
        _attach(tiny_dirs, adapter)
    for name in names:
        assert name in str(err.value), (name, str(err.value))


@pytest.mark.parametrize(("change", "key"), [({"rank": 8}, "model.lora.rank"), ({"alpha": 16.0}, "model.lora.alpha"),
                                             ({"vision": True}, "model.lora.vision")])
def test_model_lora_that_does_not_match_the_adapter_is_refused(tiny_dirs, saved_adapter, change, key):
    adapter, _ = saved_adapter
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        _attach(tiny_dirs, adapter, **change)


def test_dropout_is_not_in_the_adapter_and_takes_the_config_value(tiny_dirs, saved_adapter):
    adapter, merged = saved_adapter
    policy = _attach(tiny_dirs, adapter, dropout=0.1)
    drops = [m for n, m in policy.model.named_modules() if n.endswith("lora_dropout.default")]
    assert drops and all(isinstance(d, torch.nn.Dropout) and d.p == 0.1 for d in drops)
    again = lora.merged_state_dict(policy.model)
    assert all(torch.equal(again[k], merged[k]) for k in merged)


# ---- train.resume_config=new and a run's config.yaml ---------------------------------------------------------------

LORA_RUN = [*TINY, "model.lora.rank=4", "model.lora.alpha=8", "train.save_every=1"]


def test_resume_config_new_refuses_lora_changes_it_cannot_apply(tmp_path):
    run = tmp_path / "run"
    mmgpg("train", *LORA_RUN, "train.max_steps=1", f"output_dir={run}")
    provenance = (run / "config.yaml").read_text()
    for change in ("model.lora.rank=8", "model.lora.alpha=64", "model.lora.target_modules=[q_proj]",
                   "model.lora.trainable_modules=[lm_head]"):
        proc = mmgpg("train", *LORA_RUN, "train.max_steps=2", "train.resume=true", "train.resume_config=new", change,
                     f"output_dir={run}", check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        key = change.partition("=")[0]
        assert f"{key}:" in proc.stderr and "cannot apply" in proc.stderr, proc.stderr
        assert not (run / "config_changes.jsonl").exists()  # nothing recorded that did not happen
        assert steps(run) == [1] and (run / "config.yaml").read_text() == provenance


def test_config_yaml_describes_the_attempt_that_trained(tmp_path):
    from mmgpg.config import resolve, save_config

    run = tmp_path / "run"
    save_config(resolve([*TINY, "train.learning_rate=0.5"]), run, "train")  # an attempt that died before step 1
    mmgpg("train", *TINY, "train.max_steps=1", "train.resume=true", f"output_dir={run}")
    assert "learning_rate: 0.001" in (run / "config.yaml").read_text()  # the run that trained, not the dead attempt
