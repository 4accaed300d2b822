"""Hostile YAML: every config or run YAML mmgpg reads goes through one loader (:func:`mmgpg.typed.read_yaml`) that
refuses an alias bomb, an oversized file, a key given twice and nesting too deep to read, each as a ConfigError
naming the file and the line, quickly (nothing is expanded or printed at the bomb's size)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmgpg.cli import main
from mmgpg.config import resolve, save_config
from mmgpg.rundir import read_config, read_config_tree
from mmgpg.train.resume import read_checkpoint_config
from mmgpg.typed import YAML_MAX_BYTES, YAML_MAX_DEPTH, YAML_MAX_NODES, ConfigError, read_yaml


def alias_bomb(levels: int, key: str = "bomb") -> str:
    """The "billion laughs": level i is a list of nine aliases of level i-1, so the top expands to 9**levels
    strings from a few hundred bytes of text."""
    lines = ['l0: &l0 "lol"']
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    lines.append(f"{key}: *l{levels}")
    return "\n".join(lines) + "\n"


def test_the_limits_are_what_the_docs_say():
    assert (YAML_MAX_BYTES, YAML_MAX_NODES, YAML_MAX_DEPTH) == (1 << 20, 100_000, 64)


def test_an_alias_bomb_is_refused_before_anything_expands():
    text = alias_bomb(9)
    assert len(text) < 1000
    with pytest.raises(ConfigError, match=r"x\.yaml:\d+: .*aliases expand it to more than 100000 values") as caught:
        read_yaml(text, "x.yaml")
    assert len(str(caught.value)) < 1000


def test_aliases_within_the_limit_still_work():
    # an anchor reused a few times, and a merge key overriding one of its fields
    tree = read_yaml("base: &b {lr: 1.0e-6, steps: 3}\nrun: {<<: *b, steps: 4}\nagain: *b\n", "x.yaml")
    assert tree == {"base": {"lr": 1e-6, "steps": 3}, "run": {"lr": 1e-6, "steps": 4}, "again": tree["base"]}
    assert len(alias_bomb(4)) and read_yaml(alias_bomb(4), "x.yaml")["bomb"][0][0][0][0] == "lol"  # 9**4 values


def test_a_recursive_alias_is_refused():
    with pytest.raises(ConfigError, match="x.yaml:1: .*refers to itself"):
        read_yaml("a: &a [1, *a]\n", "x.yaml")


def test_a_duplicate_key_names_the_key_and_both_lines():
    with pytest.raises(ConfigError, match=r"x\.yaml:4: .*'learning_rate' is given twice .*first at line 2") as caught:
        read_yaml("train:\n  learning_rate: 1.0e-6\n  max_steps: 3\n  learning_rate: 1.0e-3\n", "x.yaml")
    assert "learning_rate" in str(caught.value)
    with pytest.raises(ConfigError, match=r"x\.yaml:1: .*'a' is given twice"):
        read_yaml("{a: 1, b: 2, a: 3}", "x.yaml")
    # the same key in two different mappings is not a duplicate
    assert read_yaml("x: {a: 1}\ny: {a: 2}\n", "x.yaml") == {"x": {"a": 1}, "y": {"a": 2}}


def test_deep_nesting_is_a_clear_error_not_a_recursion_error():
    deep = "a: " + "[" * 5000 + "]" * 5000 + "\n"
    with pytest.raises(ConfigError, match=r"x\.yaml:1: .*nested deeper than 64 levels"):
        read_yaml(deep, "x.yaml")
    ok = "a: " + "[" * 60 + "1" + "]" * 60 + "\n"
    assert read_yaml(ok, "x.yaml")["a"] is not None


def test_an_oversized_file_is_refused_without_reading_it(tmp_path):
    # bytes that are not UTF-8: a loader that read the file first would stop at the decoding, not at the size
    path = tmp_path / "big.yaml"
    path.write_bytes(b"a: " + b"\xff" * (YAML_MAX_BYTES + 1) + b"\n")
    with pytest.raises(ConfigError, match=r"big\.yaml: .*larger than 1 MiB"):
        read_config_tree(path)


def test_an_oversized_text_is_refused():
    """The command line's values and texts read elsewhere go through the same size limit (one byte over)."""
    with pytest.raises(ConfigError, match=r"the value: The YAML is larger than 1 MiB \(1048577 bytes\)"):
        read_yaml("a" * (YAML_MAX_BYTES + 1), "the value")
    assert read_yaml("a" * YAML_MAX_BYTES, "the value") == "a" * YAML_MAX_BYTES


def test_syntax_errors_still_name_the_file_and_line(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("a: 1\nb: [1, 2\n")
    with pytest.raises(ConfigError, match=r"config\.yaml:3: Not valid YAML"):
        read_config_tree(path)


def test_a_group_file_with_a_duplicate_key_is_a_config_problem(tmp_path):
    group = tmp_path / "mine.yaml"
    group.write_text("train:\n  max_steps: 3\n  max_steps: 30\n")
    with pytest.raises(ConfigError, match=r"mine\.yaml:3: .*'max_steps' is given twice"):
        resolve([f"recipe={group}"])
    with pytest.raises(ConfigError, match=r"nested deeper"):  # a command-line value goes through the same loader
        resolve(["task.deep=" + "[" * 100 + "]" * 100])


def test_an_alias_bomb_in_a_checkpoints_config_does_not_hang_resume(tmp_path):
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "step-00000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.yaml").write_text(alias_bomb(9, key="train"))
    with pytest.raises(ConfigError, match=r"step-00000002/config\.yaml:\d+: .*aliases"):
        read_checkpoint_config(checkpoint, run)


def test_an_alias_bomb_in_task_options_gives_a_short_diagnose_error(tmp_path, capsys):
    run = tmp_path / "run"
    save_config(resolve([]), run, "train")
    bomb = "".join(f"  {line}\n" for line in alias_bomb(6).splitlines())  # nine**6 strings as task options
    text = (run / "config.yaml").read_text().replace("task:\n  name: shapes\n", "task:\n  name: shapes\n" + bomb)
    assert bomb in text
    (run / "config.yaml").write_text(text)
    assert main(["diagnose", str(run)]) == 2
    err = capsys.readouterr().err
    assert "config.yaml" in err and "aliases" in err and len(err) < 2000
    with pytest.raises(ConfigError, match="aliases"):
        read_config(Path(run), lenient=True, use_task=False)


def test_a_group_file_that_is_not_utf8_names_the_file(tmp_path):
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "bad.yaml").write_bytes(b"name: \xff\xfe shapes\n")
    with pytest.raises(ConfigError, match=r"task/bad\.yaml: The file is not UTF-8 text \(byte 0xff at offset 6"):
        resolve(["task=bad"], config_dirs=[tmp_path])


def test_a_folder_named_like_a_group_file_is_no_choice(tmp_path, capsys):
    """``configs/model/x.yaml/`` (a folder) is not listed by ``mmgpg config groups`` and selecting it says what it is."""
    (tmp_path / "model" / "x.yaml").mkdir(parents=True)
    (tmp_path / "model" / "mine.yaml").write_text("model:\n  name_or_path: tiny\n")
    assert main(["config", "groups", "--config-dir", str(tmp_path)]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("model:")][0].split()
    assert "mine" in listed and "x" not in listed
    with pytest.raises(ConfigError, match=r"model/x\.yaml is a folder, not a config file\..*Fix: choose one of: "):
        resolve(["model=x"], config_dirs=[tmp_path])
