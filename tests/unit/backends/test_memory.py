"""mmgpg plan: parameter counts from the meta model against hand formulas, the memory formulas against hand-computed
numbers and against what torch actually saves / caches on CPU, agreement with DeepSpeed's estimators, and the CLI
(exit 1 with the fix, --json schema, one clear message for a bad combination)."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
import torch

from mmgpg.backends import memory as P
from mmgpg.cli import main
from mmgpg.cli import plan as plan_cli
from mmgpg.models.qwen2 import SHAPE_TRUE, SHAPE_TRUE_7B
from mmgpg.models.tiny import TINY, Dims, save_config_only


@pytest.fixture(scope="module")
def config_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plan_models")
    return {
        "tiny": save_config_only(root / "tiny", "qwen2_vl", "tiny"),
        "2b": save_config_only(root / "2b", "qwen2_vl", "shape_true"),
        "7b": save_config_only(root / "7b", "qwen2_5_vl", "shape_true_7b"),
    }


# ---- parameter counts: meta model vs the architecture written out by hand --------------------------------------------


def qwen_params(d: Dims, family: str) -> tuple[int, int]:
    """(total, vision) parameters of Qwen2-VL / Qwen2.5-VL, layer by layer (biases on q/k/v and the vision linears)."""
    h, i, v = d.text_hidden, d.text_intermediate, d.vocab_size
    kv = d.text_kv_heads * (h // d.text_heads)
    attn = (h * h + h) + 2 * (h * kv + kv) + h * h  # q, k, v with bias; o without
    text = v * h + d.text_layers * (attn + 3 * h * i + 2 * h) + h + (0 if d.tie_word_embeddings else v * h)
    D, M = d.vision_dim, d.vision_intermediate
    patch = 3 * 2 * 14 * 14 * D  # Conv3d(3, D, (2, 14, 14)), no bias
    qkv_proj = (3 * D * D + 3 * D) + (D * D + D)
    if family == "qwen2_vl":  # LayerNorm (weight + bias), fc1/fc2 MLP
        block = 2 * 2 * D + qkv_proj + (D * M + M) + (M * D + D)
        merger = 2 * D + (16 * D * D + 4 * D) + (4 * D * h + h)
    else:  # RMSNorm (weight), SwiGLU gate/up/down with biases
        block = 2 * D + qkv_proj + 2 * (D * M + M) + (M * D + D)
        merger = D + (16 * D * D + 4 * D) + (4 * D * h + h)
    vision = patch + d.vision_depth * block + merger
    return text + vision, vision


@pytest.mark.parametrize("key, dims, family, published", [
    ("tiny", TINY, "qwen2_vl", None),
    # Qwen2-VL-2B-Instruct: 2,208,985,600 parameters (its model card's safetensors count, "2.21B").
    ("2b", SHAPE_TRUE["qwen2_vl"], "qwen2_vl", 2_208_985_600),
    # Qwen2.5-VL-7B-Instruct: 8,292,166,656 parameters (its model card's safetensors count, "8.29B").
    ("7b", SHAPE_TRUE_7B, "qwen2_5_vl", 8_292_166_656),
])
def test_parameter_counts_match_the_architecture(config_dirs, key, dims, family, published):
    shape = P.model_shape(str(config_dirs[key]))
    total, vision = qwen_params(dims, family)
    assert (shape.params, shape.vision_params) == (total, vision)
    if published:
        assert shape.params == published
    # DeepSpeed's "largest layer": the embedding [V, H] (tied to lm_head in the 2B) is the biggest single module.
    assert shape.largest_layer_params == dims.vocab_size * dims.text_hidden


@pytest.mark.parametrize("size, billions", [("shape_true", 2.13), ("shape_true_4b", 4.44), ("shape_true_8b", 8.77)])
def test_qwen3_vl_shapes_have_the_released_parameter_counts(tmp_path, size, billions):
    """Qwen3-VL-2B/4B/8B-Instruct: 2.13 B, 4.44 B and 8.77 B parameters on their model cards (rounded there)."""
    shape = P.model_shape(str(save_config_only(tmp_path / size, "qwen3_vl", size)))
    assert round(shape.params / 1e9, 2) == billions and shape.head_dim == 128 and shape.family == "qwen3_vl"


# ---- model states: hand-computed ---------------------------------------------------------------------------------


def test_model_states_hand_computed():
    # P = 1000 parameters, 600 trainable, 4 ranks.
    f = P.model_state_bytes
    # plain, fp32 master weights: 4*1000 weights, 4*600 gradients, 8*600 AdamW m+v.
    assert f(1000, 600, 4, "plain", 0, "none", "autocast") == {"parameters": 4000, "gradients": 2400,
                                                              "optimizer": 4800, "host": 0}
    # plain, bf16 weights: AdamW state in bf16 too -> 2, 2, 4 bytes.
    assert f(1000, 600, 4, "plain", 0, "none", "bf16") == {"parameters": 2000, "gradients": 1200,
                                                          "optimizer": 2400, "host": 0}
    # ZeRO-0: 2*1000 bf16 params, 2*600 bf16 grads, 16*600 fp32 state, nothing partitioned.
    assert f(1000, 600, 4, "deepspeed", 0, "none", "bf16") == {"parameters": 2000, "gradients": 1200,
                                                              "optimizer": 9600, "host": 0}
    # ZeRO-1: fp32 state / 4 = 2400.
    assert f(1000, 600, 4, "deepspeed", 1, "none", "bf16")["optimizer"] == 2400
    # ZeRO-2: grads / 4 = 300.
    assert f(1000, 600, 4, "deepspeed", 2, "none", "bf16") == {"parameters": 2000, "gradients": 300,
                                                              "optimizer": 2400, "host": 0}
    # ZeRO-3: params / 4 = 500.
    assert f(1000, 600, 4, "deepspeed", 3, "none", "bf16") == {"parameters": 500, "gradients": 300,
                                                              "optimizer": 2400, "host": 0}
    # ZeRO-2 + optimizer offload: fp32 state and the gradient partition move to the host (2400 + 300).
    assert f(1000, 600, 4, "deepspeed", 2, "optimizer", "bf16") == {"parameters": 2000, "gradients": 0,
                                                                   "optimizer": 0, "host": 2700}
    # ZeRO-3 + optimizer and parameter offload: the bf16 partition (500) goes too.
    assert f(1000, 600, 4, "deepspeed", 3, "optimizer+params", "bf16") == {"parameters": 0, "gradients": 0,
                                                                          "optimizer": 0, "host": 3200}


def test_buffers_hand_computed():
    # 2 sequences x 10 tokens, 3 layers, 2 KV heads of 4 dims, bf16: 2*10*3*2*2*4*2 = 1920.
    assert P.kv_cache_bytes(2, 10, 3, 2, 4, 2) == 1920
    # chunk 8, vocab 100, hidden 16, fp32 weight, 5 scored tokens in bf16: 3*4*8*100 + 4*100*16 + 2*5*16 = 16160.
    assert P.logprob_bytes(8, 100, 16, 4, 5, 2) == 16160
    # 7 tokens, 3 layers, 100 bytes per token-layer, 10 when checkpointed: 2100 without, 7*(3*10 + 100) with.
    assert P.activation_bytes(7, 3, 100, 10, False) == 2100
    assert P.activation_bytes(7, 3, 100, 10, True) == 910
    assert P.zero3_working_set_bytes(1000) == 4000
    # h=4, I=8, a=2, s=3, padded (kv = h): fp32 4*(32 + 8 + 32 + 2 + 2) + 12 = 316;
    # bf16 80 + 16 + 64 + 8 + 8 + 6 = 182; autocast 120 + 16 + 64 + 8 + 8 + 6 = 222.
    assert P.layer_activation_bytes_per_token(4, 8, 2, 3, "fp32") == 316
    assert P.layer_activation_bytes_per_token(4, 8, 2, 3, "bf16") == 182
    assert P.layer_activation_bytes_per_token(4, 8, 2, 3, "autocast") == 222


# ---- activations and KV cache: the formulas against what torch really keeps ---------------------------------------


def _text_model(layers: int, dtype: torch.dtype, h=256, i=768, heads=8, kv=2, family="qwen2_vl", head_dim=None):
    """The language model of a Qwen2-VL (or ``family`` = qwen3_vl: Qwen3-VL's, qwen3: the text Qwen3) of these
    dimensions."""
    import transformers

    torch.manual_seed(0)
    text = dict(vocab_size=512, hidden_size=h, intermediate_size=i, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    ids = dict(image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503)
    if family == "qwen3":
        config = transformers.Qwen3Config(**text, head_dim=head_dim, rope_parameters={"rope_type": "default",
                                                                                      "rope_theta": 1e4})
        return transformers.Qwen3ForCausalLM(config).to(dtype).train()
    if family == "qwen3_vl":  # interleaved M-RoPE sections over head_dim / 2
        half = head_dim // 2
        section = [half - 2 * (half // 3), half // 3, half // 3]
        text.update(head_dim=head_dim, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                        "mrope_section": section, "mrope_interleaved": True})
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=h,
                      deepstack_visual_indexes=[])
        model = transformers.Qwen3VLForConditionalGeneration(transformers.Qwen3VLConfig(
            text_config=text, vision_config=vision, **ids))
        return model.to(dtype).train()
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 6, 6]}
    config = transformers.Qwen2VLConfig(text_config=text, vision_config=dict(depth=1, embed_dim=32, hidden_size=h,
                                                                             num_heads=2), **ids)
    return transformers.Qwen2VLForConditionalGeneration(config).to(dtype).train()


def _saved_bytes(layers: int, dtype: torch.dtype, seq: int, checkpointing: bool = False, padded: bool = True,
                 autocast: bool = False, **shape) -> int:
    """Bytes of the distinct non-parameter storages autograd saves in one forward of the language model (under CPU
    autocast, the bf16 copies of the weights are left out: the planner counts them on their own row)."""
    model = _text_model(layers, dtype, **shape)
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(3, 400, (2, seq))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :5] = 0  # left padding, as in every RL batch: transformers then passes a mask to SDPA
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        stack = model.model if shape.get("family") == "qwen3" else model.model.language_model
        stack(input_ids=ids, attention_mask=mask, use_cache=False)
    weight_copies = 0
    if autocast:  # q, k, v, o, gate, up, down weights of every layer, cast to bf16 once per forward
        linear = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.ndim == 2]
        weight_copies = 2 * sum(w.numel() for w in linear if w.shape != model.lm_head.weight.shape)
    return sum(storages.values()) - weight_copies


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3"])
@pytest.mark.parametrize("dtype, precision, autocast", [(torch.float32, "fp32", False), (torch.bfloat16, "bf16", False),
                                                         (torch.float32, "autocast", True)])
@pytest.mark.parametrize("padded", [True, False])
def test_qwen3_layer_activations_equal_what_autograd_saves(family, dtype, precision, autocast, padded):
    # Qwen3's q/k norms, and a query width (4 heads x 64 = 256) that is not the hidden size (128), as in Qwen3-VL-4B.
    shape = dict(h=128, i=384, heads=4, kv=2, head_dim=64, family=family)
    per_layer = (_saved_bytes(2, dtype, 32, padded=padded, autocast=autocast, **shape)
                 - _saved_bytes(1, dtype, 32, padded=padded, autocast=autocast, **shape))
    assert per_layer == 2 * 32 * P.layer_activation_bytes_per_token(128, 384, 4, 32, precision, kv_dim=2 * 64,
                                                                      masked=padded, q_dim=4 * 64, kv_heads=2,
                                                                      qk_norm=True)


@pytest.mark.parametrize("dtype, precision", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("seq", [32, 64])
def test_layer_activations_equal_what_autograd_saves(dtype, precision, seq):
    per_layer = _saved_bytes(2, dtype, seq) - _saved_bytes(1, dtype, seq)  # one more decoder layer
    tokens = 2 * seq
    # Padded: transformers repeats the 2 KV heads to 8 before SDPA, so kv_dim=64 must not be what is counted.
    assert per_layer == tokens * P.layer_activation_bytes_per_token(256, 768, 8, seq, precision, kv_dim=64)


@pytest.mark.parametrize("dtype, precision, autocast", [(torch.float32, "fp32", False), (torch.bfloat16, "bf16", False),
                                                         (torch.float32, "autocast", True)])
def test_unpadded_layer_activations_equal_what_autograd_saves(dtype, precision, autocast):
    per_layer = (_saved_bytes(2, dtype, 32, padded=False, autocast=autocast)
                 - _saved_bytes(1, dtype, 32, padded=False, autocast=autocast))
    # No mask: SDPA keeps the 2 KV heads (kv_dim = 2 x 32) and makes no bias.
    assert per_layer == 2 * 32 * P.layer_activation_bytes_per_token(256, 768, 8, 32, precision, kv_dim=64,
                                                                      masked=False)


@pytest.mark.parametrize("dtype, precision", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_checkpointed_layer_keeps_its_input_only(dtype, precision):
    per_layer = _saved_bytes(2, dtype, 32, True) - _saved_bytes(1, dtype, 32, True)
    assert per_layer == 2 * 32 * P.checkpointed_layer_bytes_per_token(256, precision)


def _vision_saved_bytes(family: str, depth: int, dtype: torch.dtype, d: int, m: int) -> tuple[int, int]:
    """(saved bytes, patches) of one vision-tower forward on one 224 x 224 image."""
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
    )

    torch.manual_seed(0)
    text = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, bos_token_id=0, eos_token_id=1, pad_token_id=0,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 6, 6]})
    ids = dict(image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503)
    patch = 16 if family == "qwen3_vl" else 14
    if family == "qwen2_vl":
        vision = dict(depth=depth, embed_dim=d, hidden_size=128, num_heads=4, mlp_ratio=m // d)
        model = Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=vision, **ids))
    elif family == "qwen3_vl":  # interleaved M-RoPE sections over head_dim 32; one DeepStack merger (not a block)
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [6, 5, 5],
                                   "mrope_interleaved": True}
        vision = dict(depth=depth, hidden_size=d, out_hidden_size=128, num_heads=4, intermediate_size=m,
                      patch_size=16, num_position_embeddings=64, deepstack_visual_indexes=[0])
        model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=dict(text, head_dim=32),
                                                              vision_config=vision, **ids))
    else:
        vision = dict(depth=depth, hidden_size=d, out_hidden_size=128, num_heads=4, intermediate_size=m,
                      window_size=112, fullatt_block_indexes=[depth - 1])
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids))
    model = model.to(dtype).train()
    grid = torch.tensor([[1, 16, 16]])
    pixels = torch.randn(256, 3 * 2 * patch * patch, dtype=dtype)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model.visual(pixels, grid_thw=grid)
    return sum(storages.values()), 256


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("dtype, precision", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_vision_block_activations_equal_what_autograd_saves(family, dtype, precision):
    # (D, M) = (192, 384): not one of the three pairs the coefficients were solved from.
    two, patches = _vision_saved_bytes(family, 2, dtype, 192, 384)
    one, _ = _vision_saved_bytes(family, 1, dtype, 192, 384)
    assert two - one == patches * P.vision_layer_bytes_per_patch(family, 192, 384, precision)


def test_kv_cache_equals_the_cache_generate_builds():
    model = _text_model(2, torch.float32).eval()
    ids = torch.randint(3, 400, (3, 20))
    with torch.no_grad():
        cache = model.model.language_model(input_ids=ids, use_cache=True).past_key_values
    real = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert real == P.kv_cache_bytes(3, 20, 2, 2, 256 // 8, 4)


# ---- DeepSpeed's estimators -------------------------------------------------------------------------------------


def test_agrees_with_deepspeed_estimators(config_dirs):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold

    from mmgpg.config import resolve

    shape = P.model_shape(str(config_dirs["2b"]))
    cfg = resolve(["model=qwen2_vl_2b", f"model.name_or_path={config_dirs['2b']}"]).config
    n = 8
    figures = {}
    for stage, offload in ((2, "none"), (2, "optimizer"), (3, "none"), (3, "optimizer"), (3, "optimizer+params")):
        plan = P.plan_memory(cfg, shape, gpus=n, gpu_memory_gb=80, backend="deepspeed", zero_stage=stage,
                             offload=offload)
        ds = plan.deepspeed
        assert ds["available"], ds
        ours, theirs = ds["ours_model_states_bytes"], ds["gpu_bytes"]
        # Same byte lists, except that DeepSpeed's ZeRO-3 figure without offload leaves out the 2-byte parameter
        # partition (its comment lists 18 bytes: grads 2+4, master 4, Adam 8); int() truncation is < 1 byte.
        missing = 2 * shape.params / n if (stage, offload) == (3, "none") else 0
        assert abs(ours - theirs - missing) <= 1, (stage, offload, ours, theirs)
        figures[(stage, offload)] = (theirs, ds["cpu_bytes_per_node"])
    # The figures are those DeepSpeed's documented *_all_cold functions print (GB = 2**30 bytes there).
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        estimate_zero2_model_states_mem_needs_all_cold(shape.params, num_gpus_per_node=n)
        estimate_zero3_model_states_mem_needs_all_cold(shape.params, shape.largest_layer_params, num_gpus_per_node=n)
    printed = out.getvalue()
    for (gpu, cpu) in figures.values():
        assert f"{cpu / 2**30:7.2f}GB | {gpu / 2**30:6.2f}GB" in printed, printed


# ---- the command ----------------------------------------------------------------------------------------------------


def run(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_7b_full_finetune_on_plain_backend_does_not_fit(config_dirs, capsys):
    code, out, _ = run(["plan", "model=qwen2_5_vl_7b", f"model.name_or_path={config_dirs['7b']}", "--gpus", "8",
                        "--gpu-memory-gb", "80"], capsys)
    assert code == 1
    assert "DOES NOT FIT" in out
    assert "--backend deepspeed --zero-stage" in out and "model.lora.rank=16 (LoRA)" in out
    # 16 bytes per parameter before any activation: 8.29e9 * 16 / 2**30 = 123.6 GiB > 80.
    plain = json.loads(run(["plan", "model=qwen2_5_vl_7b", f"model.name_or_path={config_dirs['7b']}", "--gpus", "8",
                            "--gpu-memory-gb", "80", "--json"], capsys)[1])
    assert plain["phases"]["persistent"] == 16 * 8_292_166_656


def test_zero3_fits_and_json_schema(config_dirs, capsys):
    args = ["plan", "model=qwen2_5_vl_7b", f"model.name_or_path={config_dirs['7b']}", "train.gradient_checkpointing=true",
            "--gpus", "8", "--gpu-memory-gb", "80", "--backend", "deepspeed", "--zero-stage", "3"]
    code, out, _ = run([*args, "--json"], capsys)
    assert code == 0
    plan = json.loads(out)
    assert set(plan) == {"setup", "model", "workload", "per_gpu_bytes", "phases", "host_bytes_per_node", "deepspeed",
                         "usable_bytes", "engine", "fixes", "fits"}
    assert plan["fits"] is True and plan["fixes"] == [] and plan["engine"] == {"name": "hf"}
    assert set(plan["per_gpu_bytes"]) == {k for k, _ in plan_cli.ROWS} - set(plan_cli.VLLM_ROWS)
    assert plan["phases"]["peak"] == plan["phases"]["persistent"] + max(plan["phases"]["update"],
                                                                         plan["phases"]["rollout"])
    assert plan["setup"] == {"gpus_per_node": 8, "nodes": 1, "world_size": 8, "gpu_memory_gib": 80.0,
                             "reserve_gib": 2.0, "backend": "deepspeed", "zero_stage": 3, "offload": "none",
                             "precision": "bf16"}
    code, out, _ = run(args, capsys)
    assert code == 0 and "fits: peak" in out


def test_bad_combination_is_one_message(config_dirs, capsys):
    code, _, err = run(["plan", f"model.name_or_path={config_dirs['tiny']}", "--gpus", "1", "--gpu-memory-gb", "8",
                        "--zero-stage", "2"], capsys)
    assert code == 2 and "need --backend deepspeed" in err and "Traceback" not in err
    code, _, err = run(["plan", f"model.name_or_path={config_dirs['tiny']}", "--gpus", "1", "--gpu-memory-gb", "8",
                        "--backend", "deepspeed", "--zero-stage", "2", "--offload", "optimizer+params"], capsys)
    assert code == 2 and "needs ZeRO stage 3" in err


def test_missing_model_directory_says_what_to_pass(tmp_path, capsys):
    code, _, err = run(["plan", f"model.name_or_path={tmp_path / 'nope'}", "--gpus", "1", "--gpu-memory-gb", "8"],
                       capsys)
    assert code == 2 and "--config-only" in err


def test_deepspeed_missing_is_reported_not_fatal(config_dirs, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import deepspeed -> ImportError
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.zero", None)
    est = P.deepspeed_estimate(10**9, 10**8, 8, 1, 3, "none")
    assert est["available"] is False and "cross-check skipped" in est["note"]


def test_cli_json_is_clean_json_in_a_fresh_process(config_dirs):
    """A fresh process imports deepspeed inside the command; its import-time log must not reach stdout."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "mmgpg", "plan", "model=qwen2_vl_2b",
                           f"model.name_or_path={config_dirs['2b']}", "--gpus", "8", "--gpu-memory-gb", "80", "--backend", "deepspeed",
                           "--zero-stage", "2", "--json"], capture_output=True, text=True, timeout=300)
    plan = json.loads(proc.stdout)
    assert proc.returncode == (0 if plan["fits"] else 1)
    assert plan["setup"]["zero_stage"] == 2


def test_check_runs_the_same_memory_test(capsys):
    args = ["check", "task=shapes", "model=tiny", "--examples", "1", "--gpus", "1", "--reserve-gb", "0"]
    code, out, _ = run([*args, "--gpu-memory-gb", "8"], capsys)
    assert code == 0 and "memory" in out and "fits (details: mmgpg plan)" in out
    code, out, _ = run([*args, "--gpu-memory-gb", "0.01"], capsys)  # 10 MiB: the tiny model's plan needs more
    assert code == 1 and "does not fit; changes that would fit:" in out
    code, _, err = run(["check", "task=shapes", "model=tiny", "--examples", "1", "--gpus", "1"], capsys)
    assert code == 2 and "needs both --gpus and --gpu-memory-gb" in err


def test_backend_stage_and_offload_default_to_the_train_keys(config_dirs, capsys):
    base = ["plan", "model=qwen2_5_vl_7b", f"model.name_or_path={config_dirs['7b']}", "--gpus", "8",
            "--gpu-memory-gb", "80", "--json"]
    setup = json.loads(run([*base, "train.backend=deepspeed", "train.zero_stage=3", "train.offload_optimizer=true"],
                           capsys)[1])["setup"]
    assert (setup["backend"], setup["zero_stage"], setup["offload"]) == ("deepspeed", 3, "optimizer")
    setup = json.loads(run([*base, "train.backend=deepspeed", "train.zero_stage=3", "train.offload_optimizer=true",
                            "train.offload_params=true"], capsys)[1])["setup"]
    assert setup["offload"] == "optimizer+params"
    # A flag wins over the config.
    setup = json.loads(run([*base, "train.backend=deepspeed", "train.zero_stage=3", "--zero-stage", "2"],
                           capsys)[1])["setup"]
    assert (setup["backend"], setup["zero_stage"], setup["offload"]) == ("deepspeed", 2, "none")
    setup = json.loads(run(base, capsys)[1])["setup"]  # the default config: plain
    assert (setup["backend"], setup["zero_stage"], setup["offload"]) == ("plain", 0, "none")
    # Parameter offload alone is not a setup the planner models: refused with what to do, unless --offload says.
    params_only = [*base, "train.backend=deepspeed", "train.zero_stage=3", "train.offload_params=true"]
    code, _, err = run(params_only, capsys)
    assert code == 2 and "only together with optimizer offload" in err and "--offload" in err
    setup = json.loads(run([*params_only, "--offload", "optimizer+params"], capsys)[1])["setup"]
    assert setup["offload"] == "optimizer+params"


def test_a_training_run_plans_with_its_own_backend_keys(config_dirs):
    """The first metrics record's plan/* (train.runlog.planned_memory) uses the same backend, stage and offload as
    `mmgpg plan` would for the config; a setup the planner does not model gives no plan and a note, not a wrong one."""
    from mmgpg.config import resolve
    from mmgpg.train.runlog import planned_memory

    base = ["model=qwen2_5_vl_7b", f"model.name_or_path={config_dirs['7b']}", "train.backend=deepspeed",
            "train.zero_stage=3"]
    notes: list[str] = []
    cpu = torch.device("cpu")
    plain = planned_memory(resolve(base[:2], validate_config=False).config, cpu, 8, notes.append)
    zero3 = planned_memory(resolve(base, validate_config=False).config, cpu, 8, notes.append)
    offloaded = planned_memory(resolve([*base, "train.offload_optimizer=true"], validate_config=False).config, cpu, 8,
                               notes.append)
    assert plain["plan/persistent_mib"] > zero3["plan/persistent_mib"] > offloaded["plan/persistent_mib"] > 0
    assert notes == []
    params_only = resolve([*base, "train.offload_params=true"], validate_config=False).config
    assert planned_memory(params_only, cpu, 8, notes.append) == {}
    assert len(notes) == 1 and "only together with optimizer offload" in notes[0]


# ---- the rollout engine: vLLM's share of each GPU ------------------------------------------------------------------

# Qwen2-VL-2B, plain backend, checkpointing on, 5 prompts per micro-batch, 8 x 80 GiB: fits with HF generate
# (56.6 GiB), not beside a colocated vLLM at the default 0.3 of the card.
VLLM_CASE = ["model=qwen2_vl_2b", "train.gradient_checkpointing=true", "train.micro_batch_prompts=5", "--gpus", "8",
             "--gpu-memory-gb", "80", "--json"]
SHARE_0_3_OF_80 = 25_769_803_776  # 0.3 x 80 x 2**30
SYNC_TENSOR_2B = 2 * 151_936 * 1_536  # bf16 copy of the largest module (the 151,936 x 1,536 embedding) in flight


def _plan_json(config_dirs, capsys, *extra) -> tuple[int, dict]:
    code, out, _ = run(["plan", *VLLM_CASE[:1], f"model.name_or_path={config_dirs['2b']}", *VLLM_CASE[1:], *extra],
                       capsys)
    return code, json.loads(out)


def test_vllm_colocated_share_enters_the_peak_and_the_verdict(config_dirs, capsys):
    code, hf = _plan_json(config_dirs, capsys)
    assert code == 0 and hf["fits"] and hf["engine"] == {"name": "hf"} and "vllm_engine" not in hf["per_gpu_bytes"]
    code, v = _plan_json(config_dirs, capsys, "rollout.engine=vllm")
    assert code == 1 and not v["fits"]
    per, ph = v["per_gpu_bytes"], v["phases"]
    assert per["vllm_engine"] == v["engine"]["share_bytes"] == SHARE_0_3_OF_80
    assert per["vllm_sync_tensor"] == SYNC_TENSOR_2B
    assert per["kv_cache"] == 0 and v["engine"]["weights_bytes"] == 2 * 2_208_985_600  # bf16 engine copy
    # Resident in every phase: persistent grows by the share; the update is unchanged; HF's rollout terms are gone.
    assert ph["persistent"] == hf["phases"]["persistent"] + SHARE_0_3_OF_80
    assert ph["update"] == hf["phases"]["update"] and ph["rollout"] == SYNC_TENSOR_2B
    assert ph["peak"] == hf["phases"]["persistent"] + SHARE_0_3_OF_80 + hf["phases"]["update"]
    assert ph["peak"] > v["usable_bytes"] >= hf["phases"]["peak"]
    assert "rollout.vllm_sleep=true (vLLM frees its share during the update)" in v["fixes"]
    # With vllm_sleep the share is freed during the update: it counts in the rollout phase only, and fits again.
    code, s = _plan_json(config_dirs, capsys, "rollout.engine=vllm", "rollout.vllm_sleep=true")
    assert code == 0 and s["engine"]["sleeps"]
    assert s["phases"]["persistent"] == hf["phases"]["persistent"]
    assert s["phases"]["rollout"] == SHARE_0_3_OF_80 + SYNC_TENSOR_2B
    assert s["host_bytes_per_node"] == 8 * 2 * 2_208_985_600  # the weights of each GPU's engine sleep in host memory
    code, out, _ = run(["plan", "model=qwen2_vl_2b", f"model.name_or_path={config_dirs['2b']}",
                        *VLLM_CASE[1:-1], "rollout.engine=vllm"], capsys)
    assert code == 1 and "vLLM engine share (all phases)" in out
    assert "vLLM colocated: 0.3 x 80 GiB = 24.00 GiB per GPU" in out and "DOES NOT FIT: peak 80.59 GiB" in out


def test_vllm_that_cannot_start_does_not_fit(config_dirs, capsys):
    """0.05 x 80 GiB = 4 GiB is less than the 4.11 GiB of bf16 weights: vLLM refuses to start, whatever the peak."""
    code, v = _plan_json(config_dirs, capsys, "rollout.engine=vllm", "rollout.vllm_gpu_memory_utilization=0.05")
    assert code == 1 and v["phases"]["peak"] <= v["usable_bytes"] and v["engine"]["starts"] is False
    # the least share that starts: weights + one 1,280-token sequence + the 1 GiB margin, rounded up to 0.01
    least = (2 * 2_208_985_600 + 28 * 2 * 2 * 128 * 2 * 1280 + P.VLLM_MARGIN_GIB * P.GIB) / (80 * P.GIB)
    assert f"rollout.vllm_gpu_memory_utilization={math.ceil(least * 100) / 100:g}" in v["fixes"]


def test_vllm_server_has_its_own_line_and_no_share(config_dirs, capsys):
    code, hf = _plan_json(config_dirs, capsys)
    code, v = _plan_json(config_dirs, capsys, "rollout.engine=vllm", "rollout.vllm_server=http://127.0.0.1:9",
                         "rollout.vllm_tensor_parallel_size=2")
    assert code == 0 and "vllm_engine" not in v["per_gpu_bytes"]
    assert v["phases"]["persistent"] == hf["phases"]["persistent"] and v["per_gpu_bytes"]["kv_cache"] == 0
    e = v["engine"]
    # Per server GPU, TP 2: half the bf16 weights; KV per token 28 layers x (K, V) x 1 of the 2 KV heads x 128 x 2 B;
    # every rank's rollout at full length at once.
    sequences = v["workload"]["rollout_sequences_per_rank"] * 8
    assert e["mode"] == "server" and e["weights_bytes"] == 2_208_985_600
    assert e["kv_bytes_per_token"] == 28 * 2 * 1 * 128 * 2
    assert e["needed_bytes"] == 2_208_985_600 + 28 * 2 * 128 * 2 * 1280 * sequences
    code, out, _ = run(["plan", "model=qwen2_vl_2b", f"model.name_or_path={config_dirs['2b']}", *VLLM_CASE[1:-1],
                        "rollout.engine=vllm", "rollout.vllm_server=http://127.0.0.1:9",
                        "rollout.vllm_tensor_parallel_size=2"], capsys)
    assert "vLLM server GPU (not the training GPUs)" in out and "tensor parallel 2: each of 2 GPUs" in out


def test_check_memory_row_counts_vllm(capsys):
    """The tiny model fits 0.2 GiB with HF generate (0.16 GiB), not with vLLM's 0.3 x 0.2 GiB beside it."""
    args = ["check", "task=shapes", "model=tiny", "--examples", "1", "--gpus", "1", "--reserve-gb", "0",
            "--gpu-memory-gb", "0.2"]
    code, out, _ = run(args, capsys)
    assert code == 0 and "fits (details: mmgpg plan)" in out and "vLLM" not in out
    code, out, _ = run([*args, "rollout.engine=vllm"], capsys)
    assert code == 1 and "vLLM share 0.06 GiB" in out and "does not fit" in out


def test_a_micro_batch_never_holds_more_groups_than_the_rank_has(config_dirs, capsys):
    """8 prompts on 8 GPUs: each rank trains 1 group, so train.micro_batch_prompts=5 forwards 1 (the trainer cuts
    the rank's groups into micro-batches) — unless β_th resampling may add groups to the update, up to 5."""
    def update(*extra):
        code, out = _plan_json(config_dirs, capsys, *extra)
        per = out["per_gpu_bytes"]
        return per["activations_text"], per["activations_vision"], per["logprob_buffers"]

    one = update("algo.min_valid_fraction=0", "train.micro_batch_prompts=1")
    assert update("algo.min_valid_fraction=0") == one  # micro_batch_prompts=5 from VLLM_CASE, 1 group per rank
    assert update("algo.min_valid_fraction=0.4", "algo.max_resample_attempts=1") == one  # one attempt: no growth
    five = update("algo.min_valid_fraction=0.4")
    assert all(f > o for f, o in zip(five, one))
    assert update("algo.min_valid_fraction=0", "train.prompts_per_step=40") == five  # 5 groups per rank


def test_a_video_plans_as_frames_over_two_images(config_dirs, capsys):
    """A video of model.video_max_frames = 16 frames is 8 temporal patches, each an image's rows: the vision tower's
    activations are 8 times one image's (the same pixel bound per frame); 15 frames round up to 8 patches too."""
    def vision(*extra):
        code, data = _plan_json(config_dirs, capsys, *extra)
        return data["per_gpu_bytes"]["activations_vision"], data["workload"]

    one_image, _ = vision("--images-per-prompt", "1")
    video, setup = vision("--images-per-prompt", "0", "--videos-per-prompt", "1", "model.video_max_frames=16")
    assert video == 8 * one_image > 0 and setup["frames_per_video"] == 16 and setup["videos_per_prompt"] == 1
    assert vision("--images-per-prompt", "0", "--videos-per-prompt", "1", "model.video_max_frames=15")[0] == video


def test_a_video_pixel_budget_shrinks_its_frames(config_dirs, capsys):
    """model.video_total_pixels shares one budget over a video's frames (qwen-vl-utils' rule): 16 frames with a budget
    of 2 x max_pixels keep max_pixels / 4 each, so the video's 8 frame pairs are 2 images' rows; a budget below the
    floor keeps 1.05 x min_pixels per frame."""
    def vision(*extra):
        code, data = _plan_json(config_dirs, capsys, "--images-per-prompt", "0", *extra)
        return data["per_gpu_bytes"]["activations_vision"], data["workload"]

    one_image = _plan_json(config_dirs, capsys, "--images-per-prompt", "1", "model.max_pixels=200704")[1][
        "per_gpu_bytes"]["activations_vision"]
    video = ["--videos-per-prompt", "1", "model.video_max_frames=16", "model.max_pixels=200704"]
    assert vision(*video)[0] == 8 * one_image  # the default budget caps no frame
    budgeted, workload = vision(*video, "model.video_total_pixels=401408")
    assert budgeted == 2 * one_image > 0 and workload["patches_per_video_frame"] == 50176 // 14**2
    floor, workload = vision(*video, "model.video_total_pixels=1000", "model.min_pixels=3136")
    assert workload["patches_per_video_frame"] == int(3136 * 1.05) // 14**2  # 16 patches: the floor, not the budget
