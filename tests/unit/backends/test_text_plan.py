"""mmgpg plan on a text-only model (the tiny Qwen2's config.json): parameter counts by hand, no vision terms anywhere
(rows, workload, model fields, fixes), the language-model terms equal to those of the tiny Qwen2-VL (the same
language model), and clear errors for vision settings."""

from __future__ import annotations

import json

import pytest

from mmgpg.backends import memory as P
from mmgpg.cli import main
from mmgpg.config import resolve
from mmgpg.models.tiny import TINY, save_config_only


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("text_plan")
    return {"text": save_config_only(root / "text", "qwen2", "tiny"), "vl": save_config_only(root / "vl", "qwen2_vl", "tiny")}


def text_params(d) -> int:
    """Qwen2ForCausalLM, layer by layer: embeddings, per layer q/k/v (with bias) and o, SwiGLU, two RMSNorms; the
    final norm and the untied head."""
    h, i, v = d.text_hidden, d.text_intermediate, d.vocab_size
    kv = d.text_kv_heads * (h // d.text_heads)
    attn = (h * h + h) + 2 * (h * kv + kv) + h * h
    return v * h + d.text_layers * (attn + 3 * h * i + 2 * h) + h + (0 if d.tie_word_embeddings else v * h)


def plan(path, *overrides, gpu_memory_gb=80.0, **setup):
    cfg = resolve([f"model.name_or_path={path}", "model.max_prompt_length=256", *overrides]).config
    return P.plan_memory(cfg, P.model_shape(str(path), cfg.model.lora), gpus=1, gpu_memory_gb=gpu_memory_gb, **setup)


def test_the_text_model_is_counted_and_has_no_vision(dirs):
    shape = P.model_shape(str(dirs["text"]))
    assert shape.family == "qwen2" and not shape.has_vision
    assert (shape.params, shape.vision_params) == (text_params(TINY), 0)
    assert shape.largest_layer_params == TINY.vocab_size * TINY.text_hidden


def test_the_plan_has_no_vision_terms_and_the_language_terms_of_the_vl_model(dirs):
    text, vl = plan(dirs["text"]), plan(dirs["vl"])
    assert "activations_vision" not in text.per_gpu_bytes and vl.per_gpu_bytes["activations_vision"] > 0
    assert not {k for k in text.model if k.startswith(("vision", "patch", "temporal"))} and "lora_vision" not in text.model
    assert not {"images_per_micro_batch", "patches_per_image", "freeze_vision"} & set(text.workload)
    # The tiny Qwen2 is the tiny Qwen2-VL's language model: every term but the weights' is the same.
    for key in ("activations_text", "logprob_buffers", "kv_cache"):
        assert text.per_gpu_bytes[key] == vl.per_gpu_bytes[key] > 0, key
    shape_vl = P.model_shape(str(dirs["vl"]))
    assert text.per_gpu_bytes["parameters"] == vl.per_gpu_bytes["parameters"] - 4 * shape_vl.vision_params
    copies = {k: x.per_gpu_bytes["autocast_weight_copies"] for k, x in (("text", text), ("vl", vl))}
    assert copies["vl"] - copies["text"] == (2 * shape_vl.vision_params if text.setup["precision"] == "autocast" else 0)
    assert text.phases["update"] == vl.phases["update"] - vl.per_gpu_bytes["activations_vision"] - copies["vl"] \
        + copies["text"]


def test_fixes_for_a_text_model_never_freeze_a_vision_tower(dirs):
    """With almost no memory nothing fits: the VL plan says it tried freezing its vision tower, the text one does not
    pretend to have one; and a text plan's fixes never name train.freeze_vision."""
    vl, text = plan(dirs["vl"], gpu_memory_gb=2.0001), plan(dirs["text"], gpu_memory_gb=2.0001)
    assert not vl.fits and not text.fits
    assert any("and a frozen vision tower fits" in f for f in vl.fixes)
    assert any("checkpointing and micro-batch 1 fits" in f for f in text.fixes)
    for budget in (0.3, 0.5, 1.0, 2.2):
        fixes = plan(dirs["text"], "rollout.group_size=16", gpu_memory_gb=2.0 + budget).fixes
        assert not any("freeze_vision" in f or "vision" in f for f in fixes), fixes


def test_vision_settings_on_a_text_model_are_errors(dirs):
    with pytest.raises(ValueError, match="train.freeze_vision=true, but the qwen2 model is text-only"):
        plan(dirs["text"], "train.freeze_vision=true")
    with pytest.raises(ValueError, match="model.lora.vision/merger: .* text-only qwen2 model"):
        plan(dirs["text"], "model.lora.rank=8", "model.lora.vision=true")
    lora = plan(dirs["text"], "model.lora.rank=8")  # the adapters of model.layers.N.*_proj
    h, i, kv = TINY.text_hidden, TINY.text_intermediate, TINY.text_kv_heads * (TINY.text_hidden // TINY.text_heads)
    per_layer = 8 * ((h + h) + 2 * (h + kv) + (h + h) + 2 * (h + i) + (i + h))
    assert lora.model["trainable_params"] == TINY.text_layers * per_layer


def test_cli_plan_prints_no_vision_rows(dirs, capsys):
    code = main(["plan", f"model.name_or_path={dirs['text']}", "--gpus", "1", "--gpu-memory-gb", "80"])
    out = capsys.readouterr().out
    assert code == 0 and "no images (text-only model)" in out and "vision" not in out
    assert "activations, language model" in out and "fits: peak" in out
    main(["plan", f"model.name_or_path={dirs['text']}", "--gpus", "1", "--gpu-memory-gb", "80", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["family"] == "qwen2" and "activations_vision" not in data["per_gpu_bytes"]


@pytest.mark.parametrize("family", ["qwen3_vl_moe", "qwen3_5", "qwen3_5_text", "gemma3"])
def test_layers_the_planner_has_not_measured_are_refused_not_guessed(family, capsys):
    """The decoder-layer formula was measured on Qwen2's and Qwen3's dense layers; other layers (MoE, linear
    attention, Gemma's) are refused with the reason, even with a frozen vision tower, and no plan is printed."""
    rc = main(["plan", f"model.name_or_path=tiny:{family}", "train.freeze_vision=true" if family != "qwen3_5_text"
               else "train.max_steps=1", "--gpus", "1", "--gpu-memory-gb", "80"])
    err = capsys.readouterr().err
    assert rc != 0 and "does not model the" in err and "decoder layers" in err and "planned_layers" in err


def test_check_with_gpus_warns_about_an_unplanned_family_and_runs_the_rest(capsys):
    """``mmgpg check --gpus`` on a family the planner refuses: the memory row is a warning naming why, every other
    check still runs, and the exit code is 0."""
    rc = main(["check", "task=arith", "model.name_or_path=tiny:qwen3_5_text", "--examples", "1", "--gpus", "1",
               "--gpu-memory-gb", "80"])
    out = capsys.readouterr().out
    assert rc == 0 and "not planned" in out and "gold answer" in out and "1 warning(s)" in out


def test_qwen3_vl_4b_plans_its_query_width_and_qk_norms(tmp_path, capsys):
    """Qwen3-VL-4B's layer: hidden 2560 but 32 query heads of 128 (q = 4096), q/k norms. The GEOQA recipe's
    micro-batch (8 sequences x 1280 tokens, ZeRO-3 bf16) saves, per token and layer (by hand, the formula's terms):
    16·2560 + 4·4096 + 4·4096 (keys repeated) + 8·9728 + 4·32 + 8 + 2·1280 (mask bias) + the norms' 6·4096 + 6·1024 +
    4·32 + 4·8 = 185,128 bytes; x 10,240 tokens x 36 layers = 68,245,585,920 bytes. With q = h (the Qwen2 formula)
    or without the norms the number differs."""
    from mmgpg.models.tiny import save_config_only

    path = save_config_only(tmp_path / "q3vl4b", "qwen3_vl", "shape_true_4b")
    rc = main(["plan", "recipe=geoqa_gpg", f"model.name_or_path={path}", "--gpus", "2", "--gpu-memory-gb", "80",
               "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["per_gpu_bytes"]["activations_text"] == 185_128 * 10_240 * 36
    assert data["model"]["family"] == "qwen3_vl" and rc in (0, 1)
