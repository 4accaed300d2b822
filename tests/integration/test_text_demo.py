"""The text demo (``mmgpg demo --text``: the tiny text-only Qwen2 on ``arith``) end to end through the real CLI, with a
tiny budget; and the demo's settings (the VL demo's defaults stay as they were)."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from mmgpg.train.demo import TEXT_DEFAULTS, DemoSettings, demo_settings


def test_text_demo_quick_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "mmgpg", "demo", "--text", "--quick", "--threads", "1",
                           "--output", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    text = proc.stdout
    assert "| after SFT (before gpg) |" in text and "| after gpg (2 steps) |" in text
    assert "sampled accuracy (mean of 2, T=1)" in text and "8 sums; a random model scores 0" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["text"] is True
    assert 0 <= summary["accuracy_before"] <= 1 and 0 <= summary["sampled_accuracy_after"] <= 1
    assert summary["format_before"] is not None  # arith has a judge: the format rate is eval/reward/format
    assert [s for s, _ in summary["eval_curve"]] == [0, 1, 2]
    for stage in ("sft", "gpg"):  # both stages ran the text model on the text task
        cfg = yaml.safe_load((out / stage / "config.yaml").read_text())
        assert cfg["task"]["name"] == "arith" and cfg["model"]["name_or_path"] != "tiny"
    assert yaml.safe_load((out / "sft" / "config.yaml").read_text())["model"]["name_or_path"] == "tiny:qwen2"
    rows = [json.loads(x) for x in (out / "gpg" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert all(r["eval/num_samples"] == 8 and "eval/sampled_accuracy" in r for r in evals)
    assert (out / "plots" / "evaluation.png").is_file()


def test_text_defaults_apply_only_with_text_and_flags_override_them():
    vl, text = demo_settings(False), demo_settings(True)
    assert vl == DemoSettings()  # `mmgpg demo` is unchanged
    assert text.text and all(getattr(text, k) == v for k, v in TEXT_DEFAULTS.items())
    assert any(getattr(vl, k) != v for k, v in TEXT_DEFAULTS.items())
    given = demo_settings(True, gpg_steps=7, sft_lr=None)
    assert given.gpg_steps == 7 and given.sft_lr == text.sft_lr


def test_the_evaluation_panel_plots_rates_not_counts():
    from mmgpg.train.plots import panel_series

    rows = [{"step": 0, "eval/accuracy": 0.6, "eval/parse_failures": 70.0, "eval/sampled_parse_failures": 9.0,
             "eval/num_samples": 300.0, "eval/sampled_accuracy": 0.4},
            {"step": 50, "eval/accuracy": 0.8, "eval/parse_failures": 50.0, "eval/num_samples": 300.0}]
    (title, lines), = panel_series(rows)
    assert title.startswith("evaluation")
    assert lines == {"eval/accuracy": ([0, 50], [0.6, 0.8]), "eval/sampled_accuracy": ([0], [0.4])}
