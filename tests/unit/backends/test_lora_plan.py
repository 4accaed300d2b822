"""The memory planner with LoRA: the trainable count equals what PEFT really injects and trains, gradients and AdamW
state cover the adapters only, GRPO needs no reference copy, and a 7B that does not fit fully fits with LoRA."""

from __future__ import annotations

import json

import pytest

from mmgpg.backends import memory as P
from mmgpg.cli import main
from mmgpg.config import LoraConfig, resolve
from mmgpg.models import lora
from mmgpg.models.load import load_policy
from mmgpg.models.tiny import save_config_only


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
@pytest.mark.parametrize("options", [dict(), dict(vision=True, merger=True, trainable_modules=["lm_head"])])
def test_planned_trainable_count_is_what_peft_trains(tiny_dirs, family, options):
    cfg = LoraConfig(rank=4, **options)
    shape = P.model_shape(str(tiny_dirs[family]), cfg)
    policy = load_policy(str(tiny_dirs[family]), device="cpu")
    lora.attach(policy, cfg)
    trained = {n: p.numel() for n, p in policy.model.named_parameters() if p.requires_grad}
    assert shape.lora_params == sum(trained.values())
    assert shape.lora_vision == any("visual" in n for n in trained)
    assert shape.lora_head == any("lm_head" in n for n in trained)


def test_lora_plan_counts_adapter_states_only(tmp_path):
    d = save_config_only(tmp_path / "7b", "qwen2_5_vl", "shape_true_7b")
    args = ["model=qwen2_5_vl_7b", f"model.name_or_path={d}", "algo=grpo", "train.gradient_checkpointing=true"]
    full_cfg = resolve(args).config
    lora_cfg = resolve(args + ["model.lora.rank=16"]).config
    full = P.plan_memory(full_cfg, P.model_shape(str(d)), gpus=8, gpu_memory_gb=80)
    shape = P.model_shape(str(d), lora_cfg.model.lora)
    plan = P.plan_memory(lora_cfg, shape, gpus=8, gpu_memory_gb=80)
    # Qwen2.5-VL-7B, r = 16 on q,k,v,o,gate,up,down of 28 layers (H 3584, KV 512, I 18944):
    # 16 * 28 * [(3584+3584) + 2 (3584+512) + (3584+3584) + 2 (3584+18944) + (18944+3584)] = 40,370,176
    assert shape.lora_params == 16 * 28 * ((3584 + 3584) * 2 + 2 * (3584 + 512) + 3 * (3584 + 18944)) == 40_370_176
    g = plan.per_gpu_bytes
    assert g["gradients"] == 4 * 40_370_176 and g["optimizer"] == 8 * 40_370_176
    assert g["parameters"] == 4 * (shape.params + 40_370_176)
    assert g["reference_model"] == 0 < full.per_gpu_bytes["reference_model"]
    assert g["activations_vision"] == 0 < full.per_gpu_bytes["activations_vision"]  # no gradient into the tower
    assert full.per_gpu_bytes["logprob_buffers"] - g["logprob_buffers"] == 4 * shape.vocab * shape.hidden
    with pytest.raises(ValueError, match="model_shape\\(path, cfg.model.lora\\)"):
        P.plan_memory(lora_cfg, P.model_shape(str(d)), gpus=8, gpu_memory_gb=80)
    assert not full.fits and plan.fits


def test_check_and_plan_cli_report_the_lora_share(tmp_path, capsys):
    d = save_config_only(tmp_path / "2b", "qwen2_vl", "shape_true")
    code = main(["plan", f"model.name_or_path={d}", "model.lora.rank=8", "train.gradient_checkpointing=true", "--gpus", "1", "--gpu-memory-gb", "80",
                 "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["model"]["lora_rank"] == 8 and out["workload"]["reference_model"] is False
    assert out["model"]["trainable_params"] == out["model"]["lora_params"] < out["model"]["params"] // 50
    main(["plan", f"model.name_or_path={d}", "model.lora.rank=8", "--gpus", "1", "--gpu-memory-gb", "80"])
    assert "LoRA rank 8:" in capsys.readouterr().out


def test_check_reports_what_lora_trains_and_a_missing_module():
    from mmgpg.evaluation.preflight import preflight

    findings = {f.check: f for f in preflight(resolve(["task=shapes", "model=tiny", "model.lora.rank=4"]).config)}
    # tiny Qwen2-VL: 2 decoder layers x 4 x [(128+128) + 2 (128+64) + (128+128) + 2 (128+512) + (512+128)] = 22,528
    assert findings["lora"].status == "ok" and "22,528 adapter + 0 fully trained" in findings["lora"].detail
    bad = resolve(["task=shapes", "model=tiny", "model.lora.rank=4", "model.lora.trainable_modules=[lm_haed]"]).config
    finding = {f.check: f for f in preflight(bad)}["lora"]
    assert finding.status == "error" and "lm_haed" in finding.detail and "lm_head" in finding.detail
