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
    (tmp_path / "s1-summary.json").write_text((tmp_path / "s1" / "summary.json").read_text())
    assert module.load(str(tmp_path / "s1-summary.json")) == runs[1]  # a copied summary file, e.g. docs/demo_runs/
    text = module.table(runs)
    assert "| 0 | 0.500 | 0.700 | +0.200 | 0.250 | 0.500 | +0.250 |" in text
    # gains +0.2 and 0.0: mean 0.1, sample std sqrt(0.02) = 0.141
    assert "**0.100 ± 0.141**" in text and "**0.250 ± 0.000**" in text


def test_compare_algos_summary_counts_generated_completions_and_plots(tmp_path):
    """bench/compare_algos.py on hand-made metrics: accuracies from the first and last evaluation, completions
    generated = attempts x prompts x G, tokens per step = those x mean completion tokens, one PNG of the curves."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare_algos", REPO / "bench" / "compare_algos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for seed, attempts in ((0, [1, 2]), (1, [1, 1])):
        run = tmp_path / f"dapo-seed{seed}"
        run.mkdir()
        rows = [{"step": 0, "eval/accuracy": 0.5, "eval/sampled_accuracy": 0.25}]
        rows += [{"step": i + 1, "time/step": 1.0 + seed, "rollout/resample_attempts": a, "rollout/completion_tokens": 10.0,
                  "reward/total": 0.5 + 0.1 * i} for i, a in enumerate(attempts)]
        rows[-1].update({"eval/accuracy": 0.6 + 0.1 * seed, "eval/sampled_accuracy": 0.5})
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    got = module.summarise(tmp_path, "dapo", [0, 1], per_attempt=8)
    assert got["greedy"] == [0.6, 0.7] and got["sampled_start"] == [0.25, 0.25]
    assert got["generated"] == [24, 16] and got["tokens_per_step"] == [120.0, 80.0]
    assert got["seconds"] == [1.0, 2.0] and got["curve"] == [0.5, 0.6]
    module.plot_rewards({"dapo": got["curve"]}, tmp_path / "curves.png", "test")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_profile_step_and_padding_benches_run(tmp_path):
    """bench/profile_step.py (one profiled GPG step of trl_peer's configuration) and bench/padding.py (three
    micro-batch arrangements of the same groups) run and report what they promise: phases that cover the step, and
    length ordering / packing that compute no more padding than the rollout order."""
    out = tmp_path / "profile.md"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "profile_step.py"), "--steps", "1", "--warmup", "0",
                           "--max-new-tokens", "8", "--top", "5", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert "| rollout |" in text and "| update |" in text and "`aten::" in text and "train_step" in text
    out = tmp_path / "padding.md"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "padding.py"), "--prompts", "4", "--group-size", "4",
                           "--max-new-tokens", "48", "--median-tokens", "20", "--hidden", "64", "--layers", "1",
                           "--repeats", "1", "--out", str(out)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:5]]
            for line in out.read_text().splitlines() if line.startswith("| ") and "---" not in line}
    padding = {name: int(r[1].replace(",", "")) for name, r in rows.items() if name != "micro-batches"}
    assert padding["packed"] == 0 < padding["length-ordered"] <= padding["rollout order"]
