"""Config resolution: groups, overrides, coercion, validation that reports every problem at once."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from support import REPO

from mmgpg.config import (
    Config,
    ConfigError,
    available_groups,
    config_search_path,
    field_docs,
    resolve,
    save_config,
    to_dict,
    to_yaml,
)
from mmgpg.rundir import read_config


def test_defaults_resolve_and_every_field_is_documented():
    cfg = resolve([]).config
    assert cfg == Config()

    def walk(cls):
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name), f"{cls.__name__}.{f.name} has no docstring"
            if dataclasses.is_dataclass(f.type if isinstance(f.type, type) else None):
                walk(f.type)
        for f in dataclasses.fields(cls):
            sub = getattr(cls(), f.name)
            if dataclasses.is_dataclass(sub):
                walk(type(sub))

    walk(Config)


def test_groups_then_overrides_in_order():
    assert resolve(["task=tests/x.py:Cls"], validate_config=False).config.task.name == "tests/x.py:Cls"
    r = resolve(["model=tiny", "task=shapes", "rollout.max_new_tokens=12", "model.max_pixels=6272"])
    cfg = r.config
    assert cfg.model.name_or_path == "tiny" and cfg.model.dtype == "float32"
    assert cfg.model.max_pixels == 6272  # the override beats the group file
    assert cfg.rollout.max_new_tokens == 12  # beats task/shapes.yaml's 48
    assert r.groups == {"model": "tiny", "task": "shapes"}
    # a later group file beats an earlier override of the same key
    assert resolve(["rollout.max_new_tokens=12", "task=shapes"]).config.rollout.max_new_tokens == 48


def test_values_are_parsed_and_coerced():
    cfg = resolve(["rollout.temperature=1e-1", "rollout.top_k=50", "model.encode_images_once=false",
                   "task.num_train=10"]).config
    assert cfg.rollout.temperature == pytest.approx(0.1) and isinstance(cfg.rollout.temperature, float)
    assert cfg.rollout.top_k == 50 and cfg.model.encode_images_once is False
    assert cfg.task.options == {"num_train": 10}


def test_every_problem_is_reported_once_with_what_got_why_fix():
    with pytest.raises(ConfigError) as info:
        resolve(["rollout.group_sise=4", "rollout.top_p=1.5", "model.min_pixels=abc", "model=huge",
                 "task.num_train=many", "device=tpu", "nonsense"])
    err = info.value
    keys = [p.key for p in err.problems]
    assert sorted(keys) == sorted(["nonsense", "model", "rollout.group_sise", "model.min_pixels", "rollout.top_p",
                                   "device", "task.num_train"]), keys
    text = str(err)
    assert text.startswith("7 problem(s) in the configuration:")
    assert "Did you mean 'group_size'?" in text
    assert "choose one of: qwen2_5_vl_3b, qwen2_5_vl_7b, qwen2_vl_2b, tiny, tiny_qwen2, tiny_qwen2_5_vl" in text
    assert "got 1.5" in text and "Fix:" in text


def test_range_relations_and_unknown_task():
    with pytest.raises(ConfigError) as info:
        resolve(["model.min_pixels=5000", "model.max_pixels=4000", "rollout.group_size=0", "task=shape"])
    text = str(info.value)
    assert "model.max_pixels: got 4000. It is below model.min_pixels=5000." in text
    assert "rollout.group_size: got 0" in text
    assert "No task named 'shape' is installed." in text and "Did you mean 'shapes'?" in text


def test_task_rejects_its_own_bad_option_values():
    with pytest.raises(ConfigError, match="rejected its options"):
        resolve(["task.min_shapes=4", "task.max_shapes=2"])


def test_a_section_cannot_be_set_to_a_scalar():
    with pytest.raises(ConfigError, match="is a section"):
        resolve(["rollout.group_size=4", "model.name_or_path=tiny", "rollout=3"])


def test_user_config_dir_and_file_groups(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mine.yaml").write_text("model:\n  max_pixels: 6272\n")
    (tmp_path / "base.yaml").write_text("seed: 7\n")
    r = resolve(["model=mine"], config_dirs=[tmp_path])
    assert r.config.model.max_pixels == 6272 and r.config.seed == 7
    loose = tmp_path / "loose.yaml"
    loose.write_text("rollout:\n  group_size: 3\n")
    assert resolve([f"rollout={loose}"]).config.rollout.group_size == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:2: Not valid YAML"):
        resolve([f"rollout={bad}"])
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="not a mapping"):
        resolve([f"model={listed}"])
    assert "mine" in available_groups(config_search_path([tmp_path]))["model"]


def test_saved_config_round_trips(tmp_path):
    r = resolve(["model=tiny", "task=shapes", "task.num_test=20", "rollout.top_p=0.5"])
    path = save_config(r, tmp_path, "sample")
    text = path.read_text()
    assert text.startswith("# mmgpg sample") and "# groups: model=tiny task=shapes" in text
    assert read_config(path)[0] == r.config  # the run directory's one reader
    assert yaml.safe_load(to_yaml(r.config, with_docs=True)) == to_dict(r.config)
    path.write_text(text.replace("top_p: 0.5", "top_p: 2.0"))
    with pytest.raises(ConfigError, match="rollout.top_p"):
        read_config(path)


def test_yaml_with_docs_comments_every_field():
    text = to_yaml(resolve(["task=shapes"]).config, with_docs=True)
    assert "# Completions sampled per prompt (G in the papers)." in text
    assert "# Items in the train split." not in text  # options only shown when set
    text = to_yaml(resolve(["task.num_train=3"]).config, with_docs=True)
    assert "# Items in the train split." in text


def _float_keys(cls, prefix=""):
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _float_keys(tp, prefix + f.name + ".")
        elif tp is float:
            yield prefix + f.name


@pytest.mark.parametrize("value", ["nan", ".nan", "inf", "-.inf"])
def test_every_float_field_must_be_finite(value):
    from mmgpg.config import Config, ConfigError, resolve

    keys = list(_float_keys(Config))
    assert {"train.learning_rate", "rollout.temperature", "algo.std_eps", "algo.clip_eps", "algo.kl_coef",
            "train.max_grad_norm", "sft.learning_rate"} <= set(keys)
    for key in keys:
        with pytest.raises(ConfigError) as info:
            resolve([f"{key}={value}"])
        assert [p.key for p in info.value.problems] == [key], key
        assert "finite" in str(info.value)
    with pytest.raises(ConfigError, match="train.adam_betas"):
        resolve(["train.adam_betas=[0.9, .nan]"])
    with pytest.raises(ConfigError, match="task.success_iou"):  # task options too
        resolve(["task=lisa_grounding", "task.success_iou=.nan"])


def test_temperature_zero_is_a_config_error_naming_the_key():
    from mmgpg.config import ConfigError, resolve

    with pytest.raises(ConfigError) as info:
        resolve(["rollout.temperature=0"])
    assert [p.key for p in info.value.problems] == ["rollout.temperature"]
    assert "zero variance" in str(info.value)


# ---- configs/algo: every file validates; the baselines' keys are checked ---------------------------------------------

ALGO_DIR = REPO / "configs" / "algo"


@pytest.mark.parametrize("name", sorted(p.stem for p in ALGO_DIR.glob("*.yaml")))
def test_every_algo_file_resolves_and_validates(name):
    """Each configs/algo/NAME.yaml of this checkout (config_dirs puts it first) resolves with the task and model of
    the CPU runs, sets only schema fields, and labels itself NAME."""
    for extra in ([], ["task=shapes", "model=tiny"], ["task=shapes_parity", "model=tiny", "rollout.max_new_tokens=12"]):
        cfg = resolve([f"algo={name}", *extra], config_dirs=[REPO / "configs"]).config
        assert cfg.algo.name == name
    assert len(list(ALGO_DIR.glob("*.yaml"))) >= 19  # the 10 of before issue 21 and its 9


@pytest.mark.parametrize(("overrides", "key", "words"), [
    (["algo.token_loss=reinforce", "algo.clip_eps_high=0.28"], "algo.clip_eps_high", "has no ratio to clip"),
    (["algo.token_loss=cispo", "algo.updates_per_batch=2"], "algo.clip_eps_high", "needs the cap"),
    (["algo.token_loss=cispo", "algo.clip_eps_high=4", "algo.cispo_eps_low=1.5", "algo.updates_per_batch=2"],
     "algo.cispo_eps_low", "must lie in [0, 1)"),
    (["algo.token_loss=clipped_ratio", "algo.cispo_eps_low=0.2"], "algo.cispo_eps_low", "Only the cispo"),
    (["algo.token_loss=gspo"], "algo.updates_per_batch", "the sequence ratio is exactly 1"),
    (["algo.token_loss=gspo_token"], "algo.updates_per_batch", "the sequence ratio is exactly 1"),
    (["algo.token_loss=cispo", "algo.clip_eps_high=4"], "algo.updates_per_batch", "the CISPO weight is exactly 1"),
    (["algo.token_loss=clipped_ratio", "algo.clip_eps_high=0.28"], "algo.updates_per_batch", "never acts"),
    (["algo.advantage=reinforce_pp", "algo.alpha_correction=true"], "algo.alpha_correction", "carry gradient"),
    (["algo.dual_clip=3"], "algo.dual_clip", "caps clipped_ratio's loss"),  # reinforce has no ratio
    (["algo.token_loss=clipped_ratio", "algo.dual_clip=1", "algo.updates_per_batch=2"], "algo.dual_clip", "C > 1"),
    (["algo.token_loss=clipped_ratio", "algo.dual_clip=3"], "algo.updates_per_batch", "nor does dual_clip"),
    (["algo.overlong_buffer_fraction=1.0"], "algo.overlong_buffer_fraction", "below L_max"),
    (["algo.overlong_buffer_fraction=0.01", "rollout.max_new_tokens=12"], "algo.overlong_buffer_fraction",
     "at least one token"),
])
def test_baseline_keys_that_cannot_act_are_problems(overrides, key, words):
    with pytest.raises(ConfigError) as err:
        resolve(overrides)
    problems = [p for p in err.value.problems if p.key == key]
    assert problems and any(words in p.why for p in problems), [str(p) for p in err.value.problems]


@pytest.mark.parametrize(("override", "key"), [("rollout.logprob_check_mean=0", "rollout.logprob_check_mean"),
                                               ("rollout.logprob_check_max=-0.5", "rollout.logprob_check_max")])
def test_a_post_sync_limit_at_or_below_zero_is_a_problem(override, key):
    with pytest.raises(ConfigError) as err:
        resolve([override])
    assert [p.key for p in err.value.problems] == [key] and "is > 0" in err.value.problems[0].why
    assert resolve([override.split("=")[0] + "=0.01"]).config.rollout  # a positive limit is fine


def test_off_policy_methods_validate_with_two_updates():
    for overrides in (["algo.token_loss=gspo"], ["algo.token_loss=cispo", "algo.clip_eps_high=4"],
                      ["algo.token_loss=clipped_ratio", "algo.clip_eps_high=0.28"]):
        assert resolve([*overrides, "algo.updates_per_batch=2"]).config.algo.updates_per_batch == 2


@pytest.mark.parametrize("family", ["qwen3_vl_moe", "qwen3_5_moe", "gemma3", "internvl", "llava_onevision"])
def test_vllm_with_a_family_it_does_not_serve_is_refused_at_config_time(family):
    """The vLLM engine for a family it cannot run (Family.vllm, measured in tests/integration/test_vllm.py's
    environment): one problem naming the family, why, the families it serves and the engine to use."""
    with pytest.raises(ConfigError) as err:
        resolve([f"model.name_or_path=tiny:{family}", "rollout.engine=vllm"])
    (problem,) = [p for p in err.value.problems if p.key == "rollout.engine"]
    assert f"({family})" in problem.why and "It serves qwen2_vl" in problem.why and "rollout.engine=hf" in problem.fix
    resolve([f"model.name_or_path=tiny:{family}"])  # the hf engine is fine


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl", "qwen3_5", "qwen3_5_text", "gemma3"])
def test_packing_with_a_family_that_cannot_pack_is_refused_at_config_time(family):
    with pytest.raises(ConfigError, match=r"model.packed_sequences: got 'always'.* cannot score packed rows"):
        resolve([f"model.name_or_path=tiny:{family}", "model.packed_sequences=always"])
    resolve(["model.name_or_path=tiny:qwen3", "model.packed_sequences=always"])  # an attention-only text model packs
