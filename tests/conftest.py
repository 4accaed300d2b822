"""Shared fixtures: tiny models built offline once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Models named `tiny` are built into a per-session cache, never the user's ~/.cache/mmgpg."""
    old = os.environ.get("MMGPG_CACHE")
    os.environ["MMGPG_CACHE"] = str(tmp_path_factory.mktemp("mmgpg_cache"))
    yield
    if old is None:
        os.environ.pop("MMGPG_CACHE", None)
    else:
        os.environ["MMGPG_CACHE"] = old


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """A saved tiny model of each vision-language family of the Qwen-VL policy: {"qwen2_vl": dir, ...}
    (support.families.QWEN_VL)."""
    from support.families import QWEN_VL

    from mmgpg.models.tiny import build_and_save

    root = tmp_path_factory.mktemp("tiny")
    return {fam: build_and_save(root / fam, family=fam) for fam in QWEN_VL}


@pytest.fixture(scope="session")
def image_text_dirs(tmp_path_factory) -> dict[str, Path]:
    """A saved tiny model of each family of the generic image-text-to-text policy (support.families.IMAGE_TEXT)."""
    from support.families import IMAGE_TEXT

    from mmgpg.models.tiny import build_and_save

    root = tmp_path_factory.mktemp("image_text")
    return {fam: build_and_save(root / fam, family=fam) for fam in IMAGE_TEXT}


@pytest.fixture(scope="session")
def tiny_text_dirs(tmp_path_factory) -> dict[str, Path]:
    """A saved tiny model of each text-only family (support.families.TEXT): Qwen2ForCausalLM, Qwen3ForCausalLM with
    the local tokenizer and a Qwen-style chat template."""
    from support.families import TEXT

    from mmgpg.models.tiny import build_and_save

    root = tmp_path_factory.mktemp("tiny_text")
    return {fam: build_and_save(root / fam, family=fam) for fam in TEXT}


@pytest.fixture(scope="session")
def tiny_text_dir(tiny_text_dirs) -> Path:
    """The tiny text-only Qwen2 (the paper's text family)."""
    return tiny_text_dirs["qwen2"]


@pytest.fixture(scope="session")
def tiny_sam_dir(tmp_path_factory) -> Path:
    """A random-weight SAM (64 px images, 4x4 image embedding) with a matching processor, saved offline."""
    import torch
    from transformers import SamConfig, SamImageProcessor, SamModel, SamProcessor

    torch.manual_seed(0)
    config = SamConfig(
        vision_config=dict(
            hidden_size=32,
            output_channels=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=64,
            patch_size=16,
            window_size=2,
            global_attn_indexes=[1],
            num_pos_feats=8,  # 2 * num_pos_feats = output_channels
            mlp_dim=64,
        ),
        prompt_encoder_config=dict(hidden_size=16, image_size=64, patch_size=16, mask_input_channels=4),
        mask_decoder_config=dict(
            hidden_size=16, mlp_dim=32, num_hidden_layers=2, num_attention_heads=2, iou_head_hidden_dim=16
        ),
    )
    out = tmp_path_factory.mktemp("tiny_sam")
    SamModel(config).save_pretrained(out)
    image_processor = SamImageProcessor(
        size={"longest_edge": 64},
        pad_size={"height": 64, "width": 64},
        mask_size={"longest_edge": 16},
        mask_pad_size={"height": 16, "width": 16},
    )
    SamProcessor(image_processor=image_processor).save_pretrained(out)
    return out


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run the tests marked slow (as does MMGPG_SLOW=1 or -m slow)")


def run_slow(config) -> bool:
    """Tests marked ``slow`` run only with ``--runslow``, ``MMGPG_SLOW=1`` or a ``-m`` expression that selects
    ``slow`` (CI runs plain ``pytest``, which skips them: long end-to-end runs whose parts faster tests cover)."""
    expr = config.getoption("-m") or ""
    return bool(config.getoption("--runslow") or os.environ.get("MMGPG_SLOW") == "1"
                or ("slow" in expr and "not slow" not in expr))


def pytest_collection_modifyitems(config, items):
    if run_slow(config):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow or MMGPG_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    """A run in which no test passed is a failure (CI must never go green on an empty or all-skipped suite)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    passed = len(reporter.stats.get("passed", [])) if reporter else 0
    if exitstatus == 0 and passed == 0:
        session.exitstatus = 5


# The fault tests' shared run (tests/support/faults_support.py): registered here so that any test module can use it.
from support.faults_support import checkpoint_copy, trained_run  # noqa: E402, F401
