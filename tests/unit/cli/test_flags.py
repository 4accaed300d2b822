"""Absurd or malformed flag values of ``mmgpg plan`` / ``check`` / ``theory predict`` / ``probe`` / ``diagnose`` are
refused by argparse (exit 2, the flag named with its allowed range) before anything is loaded — never a traceback
(``--gpu-memory-gb inf`` raised OverflowError, ``nan`` "cannot convert float NaN to integer", ``--batch-prompts 0``
"range() arg 3 must not be zero"), never a silent nonsense result (``--reserve-gb -3`` planned 83 GiB usable of 80,
``--examples -1`` checked every example)."""

from __future__ import annotations

import pytest

from mmgpg.cli import main
from mmgpg.cli.common import float_in, int_in

PLAN = ["plan", "model=tiny"]
BAD = [
    (["plan", "model=tiny", "--gpus", "-1", "--gpu-memory-gb", "80"], "--gpus", "from 1 to 64"),
    (["plan", "model=tiny", "--gpus", "10000000000", "--gpu-memory-gb", "80"], "--gpus", "from 1 to 64"),
    (["plan", "model=tiny", "--gpus", "two", "--gpu-memory-gb", "80"], "--gpus", "whole number"),
    (["plan", "model=tiny", "--gpus", "1", "--gpu-memory-gb", "0"], "--gpu-memory-gb", "(0, 10000]"),
    (["plan", "model=tiny", "--gpus", "1", "--gpu-memory-gb", "nan"], "--gpu-memory-gb", "finite"),
    (["plan", "model=tiny", "--gpus", "1", "--gpu-memory-gb", "inf"], "--gpu-memory-gb", "finite"),
    (["plan", "model=tiny", "--gpus", "1", "--gpu-memory-gb", "1e300"], "--gpu-memory-gb", "finite"),
    (["plan", "model=tiny", "--gpus", "1", "--gpu-memory-gb", "80", "--nodes", "0"], "--nodes", "from 1"),
    (["plan", "model=tiny", "--gpus", "1", "--gpu-memory-gb", "80", "--reserve-gb", "-3"], "--reserve-gb", "[0,"),
    (["plan", "model=tiny", "--gpus", "1", "--gpu-memory-gb", "80", "--reserve-gb", "nan"], "--reserve-gb", "finite"),
    (["plan", "model=tiny", "--gpus", "1", "--gpu-memory-gb", "80", "--images-per-prompt", "-1"],
     "--images-per-prompt", "from 0"),
    (["check", "model=tiny", "--examples", "-1"], "--examples", "from 1"),
    (["theory", "predict", "--p-ref", "0.2", "--visits", "1000000000000"], "--visits", "from 1 to 1000000000"),
    (["theory", "predict", "--p-ref", "0.2", "--paper-eps", "-1"], "--paper-eps", "(0, 1]"),
    (["theory", "predict", "--p-ref", "0.2", "--paper-eps", "nan"], "--paper-eps", "finite"),
    (["theory", "predict", "--p-ref", "0.2", "--paper-eps", "0"], "--paper-eps", "(0, 1]"),
    (["diagnose", "RUN", "--success-threshold", "nan"], "--success-threshold", "finite"),
    (["probe", "tiny", "--samples", "1000000000000"], "--samples", "from 1 to 100000"),
    (["probe", "tiny", "--samples", "0"], "--samples", "from 1"),
    (["probe", "tiny", "--limit", "-1"], "--limit", "from 1"),
    (["probe", "tiny", "--batch-prompts", "0"], "--batch-prompts", "from 1"),
    (["probe", "tiny", "--step", "-1"], "--step", "from 0"),
    (["probe", "tiny", "--success-threshold", "inf"], "--success-threshold", "finite"),
    (["model", "tiny", "--out", "X", "--seed", str(2**70)], "--seed", "from 0 to 4294967295"),  # was an Overflow
    (["demo", "--seed", "-1"], "--seed", "from 0 to 4294967295"),
    (["eval", "--task", "shapes", "--ckpt", "tiny", "--samples", "2", "--seed", str(2**32)], "--seed", "from 0"),
]


@pytest.mark.parametrize("args, flag, words", BAD, ids=[" ".join(a[:1] + a[-2:]) for a, _, _ in BAD])
def test_absurd_flag_values_are_argparse_errors(args, flag, words, capsys):
    with pytest.raises(SystemExit) as caught:
        main(args)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and words in err and "Traceback" not in err, err


def test_a_reserve_as_large_as_the_gpu_is_refused(capsys):
    assert main([*PLAN, "--gpus", "1", "--gpu-memory-gb", "8", "--reserve-gb", "8"]) == 2
    assert "--reserve-gb 8 leaves nothing of --gpu-memory-gb 8" in capsys.readouterr().err


def test_the_range_types_by_hand():
    assert int_in(1, 8)("8") == 8 and float_in(0, 1, low_open=True)("1") == 1.0 and float_in(0, 1)("0") == 0.0
    for parse, text in ((int_in(1, 8), "9"), (int_in(1, 8), "1.5"), (float_in(0, 1, low_open=True), "0"),
                        (float_in(0, 1), "-inf"), (float_in(0, 1), "x")):
        with pytest.raises(Exception, match="must be"):
            parse(text)


def test_a_seed_past_32_bits_is_a_config_error_before_training(capsys):
    """``seed=2^70`` passed ``config show`` and failed in training ("Overflow when unpacking long long")."""
    assert main(["config", "show", f"seed={2**70}"]) == 2
    err = capsys.readouterr().err
    assert f"seed: got {2**70}. Seeds are whole numbers from 0 to 2^32 - 1 = 4294967295" in err
    assert main(["config", "show", f"seed={2**32 - 1}"]) == 0


@pytest.mark.parametrize("where", ["/nonexistent/dir", "./no/such/dir"])
def test_plan_of_a_missing_model_directory_says_so(where, capsys):
    """Not the hub's repo-id rule ("Repo id must be in the form 'repo_name' or 'namespace/repo_name'")."""
    assert main(["plan", f"model.name_or_path={where}", "--gpus", "1", "--gpu-memory-gb", "80"]) == 2
    err = capsys.readouterr().err
    assert f"model directory {where!r} does not exist" in err and "Repo id" not in err and "Traceback" not in err
