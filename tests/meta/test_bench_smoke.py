"""Bench scripts run end to end (the GPU step on the tiny model on CPU, so it does not rot between GPU sessions;
the demo table on hand-made summaries)."""

import json
import subprocess
import sys

from support import REPO as _REPO

REPO = _REPO


def test_gpu_step_bench_runs_on_cpu_with_the_tiny_model(tmp_path):
    cmd = [sys.executable, str(REPO / "bench" / "gpu_step.py"), "--size", "tiny", "--device", "cpu", "--steps", "2",
           "--prompts", "2", "--micro-batch", "1", "--max-new-tokens", "8", "--image-pixels", "12544",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "gpu_step-tiny-cpu.json").read_text())
    assert len(result["steps"]) == 2 and result["median_step_seconds"] > 0
    assert (tmp_path / "gpu_step-tiny-cpu.md").read_text().startswith("# `python")


def test_demo_table_mean_and_spread(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo_table", REPO / "bench" / "demo_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runs = []
    for seed, (gb, ga) in enumerate([(0.5, 0.7), (0.6, 0.6)]):
        run = tmp_path / f"s{seed}"
        run.mkdir()
        (run / "summary.json").write_text(json.dumps({"settings": {"seed": seed}, "accuracy_before": gb,
                                                      "accuracy_after": ga, "sampled_accuracy_before": 0.25,
                                                      "sampled_accuracy_after": 0.5}))
        runs.append(module.load(str(run)))
    text = module.table(runs)
    assert "| 0 | 0.500 | 0.700 | +0.200 | 0.250 | 0.500 | +0.250 |" in text
    # gains +0.2 and 0.0: mean 0.1, sample std sqrt(0.02) = 0.141
    assert "**0.100 ± 0.141**" in text and "**0.250 ± 0.000**" in text
