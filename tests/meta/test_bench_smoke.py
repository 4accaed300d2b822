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


def test_families_bench_runs_and_refuses_what_an_engine_does_not_serve(tmp_path):
    """bench/families.py: a text and a vision-language family, 2 GPG steps each (the first a warm-up), one table row
    each with positive times and tokens/s and every phase's peak RSS; a family the vLLM engine does not serve is
    refused by name."""
    out = tmp_path / "families.md"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "families.py"), "--families", "qwen3,qwen3_vl",
                           "--steps", "2", "--out", str(out)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in out.read_text().splitlines() if line.startswith("| qwen3")]
    assert [line.split("|")[1].strip() for line in lines] == ["qwen3", "qwen3_vl"]
    for line in lines:
        cells = [c.strip() for c in line.split("|")[3:-1]]
        assert all(float(c) > 0 for c in cells), line
    assert "peak RSS rollout MiB" in out.read_text() and "load average" in out.read_text()
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "families.py"), "--engine", "vllm", "--families",
                           "gemma3"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode != 0 and "not a family the vllm engine runs: gemma3" in proc.stderr


def _gpu_acceptance():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_acceptance", REPO / "bench" / "gpu_acceptance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_acceptance_dry_run_records_every_cell(tmp_path):
    """The GPU acceptance script's --dry-run (tiny model, CPU, 1 step, 3 cells): each cell is a real ``mmgpg train``
    whose metrics.jsonl is parsed; a cell that cannot run is recorded and the script goes on."""
    import importlib.util

    cmd = [sys.executable, str(REPO / "bench" / "gpu_acceptance.py"), "--dry-run", "--budget-s", "900",
           "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [path] = list((tmp_path / "out").glob("*-dry-run.json"))
    result = json.loads(path.read_text())
    cells = {c["cell"]: c for c in result["cells"]}
    assert list(cells) == ["hf-plain-full", "hf-zero3-lora", "vllm-plain-full"]
    ok = cells["hf-plain-full"]
    assert ok["status"] == "ok", ok
    s = ok["summary"]
    assert s["steps"] == 1 and s["tokens_per_s"] > 0 and s["seconds_per_step"] > 0 and s["peak_rss_gib"] > 0
    assert s["mfu"] is None and "MFU not computed" in result["peak_source"]  # no bf16 peak for a CPU
    assert cells["hf-zero3-lora"]["status"] == "ok" or cells["hf-zero3-lora"]["status"].startswith("error")
    if importlib.util.find_spec("vllm") is None:
        assert cells["vllm-plain-full"]["status"] == "skipped: vllm not importable"
        assert result["sync"]["status"].startswith("skipped: vllm not importable")  # the weight-sync comparison
    assert "| hf-plain-full | ok |" in path.with_suffix(".md").read_text()
    assert "budget" in proc.stdout  # each cell's time budget is printed before it runs


def test_gpu_acceptance_cell_timeout_kills_the_cell_and_goes_on(tmp_path):
    module = _gpu_acceptance()
    status, seconds = module.run_cell([sys.executable, "-c", "import time; time.sleep(600)"], 1, tmp_path / "log")
    assert status == "timeout after 1 s" and seconds < 300
    status, _ = module.run_cell([sys.executable, "-c", "raise SystemExit('bad cell')"], 60, tmp_path / "log")
    assert status == "error (exit 1): bad cell"


def test_gpu_acceptance_summary_and_mfu_by_hand():
    """Two measured steps (the first of three is warm-up): 100 and 300 completion tokens in 1 s and 3 s -> 100
    tokens/s; MFU = 6 N tokens / s / peak = 6 * 1e9 * 400 / 4 / 1e12 = 0.6."""
    module = _gpu_acceptance()
    rows = [{"step": 1, "time/step": 50.0, "throughput/completion_tokens_per_s": 1.0, "time/sync": 9.0,
             "memory/rollout_cuda_allocated_mib": 4096.0},
            {"step": 2, "time/step": 1.0, "throughput/completion_tokens_per_s": 100.0, "time/sync": 0.5,
             "rollout/logprob_diff_mean": 1e-3, "rollout/logprob_diff_max": 0.1,
             "memory/update_cuda_allocated_mib": 2048.0, "memory/update_cuda_reserved_mib": 3072.0},
            {"step": 3, "time/step": 3.0, "throughput/completion_tokens_per_s": 100.0, "time/sync": 1.5,
             "rollout/logprob_diff_mean": 2e-3, "rollout/logprob_diff_max": 0.05}]
    s = module.summarise(rows, params=10**9, peak_flops=1e12)
    assert s["measured_steps"] == 2 and s["seconds_per_step"] == 2.0 and s["tokens_per_s"] == 100.0
    assert abs(s["mfu"] - 0.6) < 1e-12 and s["sync_seconds"] == 1.0
    assert s["logprob_diff_mean"] == 2e-3 and s["logprob_diff_max"] == 0.1
    assert s["peak_allocated_gib"] == 4.0 and s["peak_reserved_gib"] == 3.0  # the peak over all steps' phases
    assert module.detect_gpu("cuda", 100.0)[1] == 1e14  # --peak-tflops wins
