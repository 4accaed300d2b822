"""The GPU benchmark script runs end to end (tiny model, CPU) so it does not rot between GPU sessions."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gpu_step_bench_runs_on_cpu_with_the_tiny_model(tmp_path):
    cmd = [sys.executable, str(REPO / "bench" / "gpu_step.py"), "--size", "tiny", "--device", "cpu", "--steps", "2",
           "--prompts", "2", "--micro-batch", "1", "--max-new-tokens", "8", "--image-pixels", "12544",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "gpu_step-tiny-cpu.json").read_text())
    assert len(result["steps"]) == 2 and result["median_step_seconds"] > 0
    assert (tmp_path / "gpu_step-tiny-cpu.md").read_text().startswith("# `python")
