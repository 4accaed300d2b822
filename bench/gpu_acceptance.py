"""GPU acceptance: a few GPG steps of the shape-true Qwen2-VL-2B per cell of engine x backend x fine-tuning.

One command on one GPU (no download: the model is ``mmgpg model tiny --size shape_true``, the real 2B dimensions with
random weights, saved in bfloat16; training runs the default mixed precision, bf16 autocast or DeepSpeed bf16):

    python bench/gpu_acceptance.py                  # 8 cells: {hf, vllm} x {plain, zero3} x {full, lora}
    python bench/gpu_acceptance.py --dry-run        # the same code on the tiny model on CPU: 1 step, 3 cells

Each cell is ``mmgpg train`` in its own subprocess (its own process group, killed at its timeout), so a hang or a
crash costs that cell only: the cell is recorded with its status (``ok``, ``error: <last line>``, ``timeout``,
``skipped: vllm not importable``) and the script goes on. The time budget (``--budget-s``, default 480 s = 8 min,
model build included) is shared out: each cell gets what is left divided by the cells left (printed before it runs).

Per cell, from the run's ``metrics.jsonl`` (the trainer's own numbers, steps after the first when there are more):
completion tokens/s (``throughput/completion_tokens_per_s``), seconds per step, the weight-sync seconds
(``time/sync``), the post-sync log-prob difference (``rollout/logprob_diff_mean`` / ``_max``: vLLM against the
trainer after each sync), the peak GPU memory (the largest ``memory/<phase>_cuda_allocated_mib`` / ``_reserved_mib``,
torch's ``max_memory_allocated`` / ``max_memory_reserved`` per phase) and the MFU estimate

    MFU = 6 · N · tokens / seconds / peak bf16 FLOP/s of the detected GPU

with N the model's parameters and tokens its completion tokens (prompt and image tokens, which are trained too, are
not counted, and generation costs 2·N per token, not 6·N: a rough figure for comparing cells, not a profile). The peak
used is printed and stored (``--peak-tflops`` sets it for a GPU not in :data:`PEAK_BF16_TFLOPS`). Results go to
``bench/results/gpu/<date>-<gpu>.json`` and ``.md`` (``--out`` elsewhere).

After the cells, the weight channels of the vLLM server mode are timed side by side (``bench/vllm_sync.py`` in a
subprocess, ``--sync-timeout`` seconds on top of the budget, ``--no-sync`` to leave it out): seconds per GiB of one
sync through ``nccl`` (server on a second GPU), ``ipc`` (CUDA IPC, server on the trainer's GPU), ``gloo`` (through
host memory) and ``files``, each checked by the server's log-probs after a sync of changed weights. On GPU: a random
Qwen2 of 16 layers x 2048 (about 1.6 GiB in bfloat16). The dry run times gloo and files on the CPU with a small
model and writes ``skipped: ... needs CUDA`` for nccl and ipc (the NCCL and IPC code runs on the first GPU; it has
not run anywhere yet). The server needs vLLM: ``--vllm-python`` names the interpreter that has it (default this one).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# Dense bf16 tensor-core peak (no sparsity), TFLOP/s, from NVIDIA's datasheets; matched against the device name in
# this order (the first substring found wins).
PEAK_BF16_TFLOPS = (
    ("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("A100", 312.0), ("L40S", 362.05), ("L4", 121.0),
)

ENGINES, BACKENDS, TUNES = ("hf", "vllm"), ("plain", "zero3"), ("full", "lora")
DRY_RUN_CELLS = (("hf", "plain", "full"), ("hf", "zero3", "lora"), ("vllm", "plain", "full"))
"""The reduced set of ``--dry-run``: one plain cell, one DeepSpeed cell, one vLLM cell."""


def cells(dry_run: bool) -> list[tuple[str, str, str]]:
    return list(DRY_RUN_CELLS) if dry_run else [(e, b, t) for e in ENGINES for b in BACKENDS for t in TUNES]


def cell_name(cell: tuple[str, str, str]) -> str:
    return "-".join(cell)


def overrides(cell: tuple[str, str, str], model: Path, run_dir: Path, args) -> list[str]:
    """The ``mmgpg train`` arguments of one cell. ``shapes_parity`` rewards the parity of the completion length, so
    about half of a random model's completions score 1 and every step really updates."""
    engine, backend, tune = cell
    out = ["task=shapes_parity", "task.num_train=256", f"model.name_or_path={model}", f"device={args.device}",
           f"model.max_pixels={args.image_pixels}", f"train.max_steps={args.steps}",
           f"train.prompts_per_step={args.prompts}", f"train.micro_batch_prompts={args.micro_batch}",
           f"rollout.group_size={args.group_size}", f"rollout.max_new_tokens={args.max_new_tokens}",
           "algo.min_valid_fraction=0", "train.progress=false", "train.tensorboard=false", "train.save_every=0",
           f"rollout.engine={engine}", f"output_dir={run_dir}"]
    if engine == "vllm":
        out.append(f"rollout.vllm_gpu_memory_utilization={args.vllm_memory}")
    if backend == "zero3":
        out += ["train.backend=deepspeed", "train.zero_stage=3"]
    if tune == "lora":
        out.append("model.lora.rank=16")
    return out


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarise(rows: list[dict], params: int, peak_flops: float | None) -> dict:
    """The cell's numbers from its ``metrics.jsonl`` records (steps after the first when there are more)."""
    steps = [r for r in rows if "time/step" in r]
    measured = steps[1:] or steps
    if not measured:
        return {"steps": 0}
    seconds = sum(r["time/step"] for r in measured)
    tokens = sum(r["throughput/completion_tokens_per_s"] * r["time/step"] for r in measured)

    def largest(suffix: str) -> float | None:
        values = [v for r in steps for k, v in r.items() if k.startswith("memory/") and k.endswith(suffix)]
        return max(values) / 1024 if values else None  # MiB -> GiB

    diffs_mean = [r["rollout/logprob_diff_mean"] for r in measured if "rollout/logprob_diff_mean" in r]
    diffs_max = [r["rollout/logprob_diff_max"] for r in measured if "rollout/logprob_diff_max" in r]
    return {
        "steps": len(steps), "measured_steps": len(measured), "seconds_per_step": seconds / len(measured),
        "tokens_per_s": tokens / seconds if seconds else None,
        "mfu": 6 * params * tokens / seconds / peak_flops if peak_flops and seconds else None,
        "peak_allocated_gib": largest("_cuda_allocated_mib"), "peak_reserved_gib": largest("_cuda_reserved_mib"),
        "peak_rss_gib": largest("_rss_mib"),
        "sync_seconds": sum(r.get("time/sync", 0.0) for r in measured) / len(measured),
        "logprob_diff_mean": max(diffs_mean) if diffs_mean else None,
        "logprob_diff_max": max(diffs_max) if diffs_max else None,
    }


def last_line(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1][:400] if lines else "(no output)"


def run_cell(cmd: list[str], timeout: float, log: Path) -> tuple[str, float]:
    """Run ``cmd`` in its own process group; kill the whole group at ``timeout``. (status, seconds)."""
    t0 = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return f"timeout after {timeout:.0f} s", time.monotonic() - t0
    status = "ok" if rc == 0 else f"error (exit {rc}): {last_line(log.read_text(errors='replace'))}"
    return status, time.monotonic() - t0


def detect_gpu(device: str, peak_tflops: float | None) -> tuple[str, float | None, str]:
    """(device name, peak bf16 FLOP/s or None, where the peak came from)."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
    else:
        import platform

        name = "cpu " + (platform.processor() or platform.machine())
    if peak_tflops:
        return name, peak_tflops * 1e12, f"--peak-tflops {peak_tflops:g}"
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in name and not name.startswith("cpu"):
            return name, tflops * 1e12, f"{key}: {tflops:g} TFLOP/s dense bf16 (datasheet)"
    return name, None, "no bf16 peak known for this device (pass --peak-tflops): MFU not computed"


def build_model(size: str, out: Path, timeout: float) -> None:
    cmd = [sys.executable, "-m", "mmgpg", "model", "tiny", "--size", size, "--out", str(out)]
    if size == "shape_true":
        cmd += ["--dtype", "bfloat16"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout)


def run_sync(args, work: Path, timeout: float) -> dict:
    """bench/vllm_sync.py in ``args.vllm_python``: its result, or ``{"status": why}`` when it could not run."""
    python = args.vllm_python or sys.executable
    probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True)
    if probe.returncode != 0:
        return {"status": f"skipped: vllm not importable in {python}"}
    out = work / "vllm_sync.json"
    size = (["--hidden", "256", "--layers", "2", "--repeats", "1"] if args.dry_run
            else ["--hidden", "2048", "--layers", "16", "--repeats", "3", "--dtype", "bfloat16"])
    cmd = [python, str(Path(__file__).parent / "vllm_sync.py"), "--device", "cpu" if args.dry_run else "cuda",
           *size, "--json", str(out)]
    print(f"[sync] budget {timeout:.0f} s: {' '.join(cmd[1:])}", flush=True)
    status, seconds = run_cell(cmd, timeout, work / "vllm_sync.log")
    if status != "ok" or not out.exists():
        return {"status": status, "seconds": seconds}
    return {"status": "ok", "seconds": seconds, **json.loads(out.read_text())}


def sync_markdown(sync: dict) -> list[str]:
    if not sync:
        return []
    lines = ["", f"Weight sync, server mode (`bench/vllm_sync.py`): {sync['status']}"]
    if sync["status"] != "ok":
        return lines
    lines += [f"model {sync['model_gib']:.3f} GiB ({sync['layers']} layers x {sync['hidden']}, {sync['dtype']}) on "
              f"{sync['device']}; median of the timed syncs; log-prob diff = max |server - trainer| after a sync of "
              "changed weights", "", "| transport | status | median s | s/GiB | log-prob diff max |", "|---|---|---:|---:|---:|"]
    for t in ("nccl", "ipc", "gloo", "files"):
        row = sync.get(t)
        if row is None:
            continue
        if row["status"] != "ok":
            lines.append(f"| {t} | {row['status']} | – | – | – |")
        else:
            lines.append(f"| {t} | ok | {row['median_s']:.3f} | {row['s_per_gib']:.2f} | "
                         f"{row['logprob_diff_max_after_sync']:.2e} |")
    return lines


def markdown(result: dict) -> str:
    def num(v, fmt):
        return "–" if v is None else format(v, fmt)

    lines = [f"# GPU acceptance: `{result['command']}`", "",
             f"{result['date_utc']} UTC, {result['device']}, torch {result['torch']}, model {result['model']} "
             f"({result['parameters']:,} parameters); MFU peak: {result['peak_source']}; budget "
             f"{result['budget_s']:.0f} s, used {result['elapsed_s']:.0f} s", "",
             f"Workload per step: {result['settings']['prompts']} prompts x G={result['settings']['group_size']}, "
             f"<= {result['settings']['max_new_tokens']} new tokens, max_pixels {result['settings']['image_pixels']}; "
             f"{result['settings']['steps']} step(s), the first not measured when there are more.", "",
             "| cell | status | tokens/s | s/step | MFU | peak alloc GiB | peak reserved GiB | sync s | "
             "log-prob diff mean / max |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for c in result["cells"]:
        s = c.get("summary") or {}
        diff = ("–" if s.get("logprob_diff_mean") is None
                else f"{s['logprob_diff_mean']:.2e} / {num(s.get('logprob_diff_max'), '.2e')}")
        status = c["status"].replace("|", "\\|")
        lines.append(f"| {c['cell']} | {status} | {num(s.get('tokens_per_s'), '.0f')} | "
                     f"{num(s.get('seconds_per_step'), '.2f')} | {num(s.get('mfu'), '.2%')} | "
                     f"{num(s.get('peak_allocated_gib'), '.2f')} | {num(s.get('peak_reserved_gib'), '.2f')} | "
                     f"{num(s.get('sync_seconds'), '.3f')} | {diff} |")
    lines += sync_markdown(result.get("sync") or {})
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny model on CPU, 1 step per cell, the reduced cell set (the CI smoke test)")
    ap.add_argument("--budget-s", type=float, default=None, help="whole run, model build included (default 480; "
                    "dry run 110)")
    ap.add_argument("--cell-timeout", type=float, default=None,
                    help="fixed seconds per cell instead of the share of the budget left")
    ap.add_argument("--steps", type=int, default=None, help="steps per cell (default 3; dry run 1)")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per step (default 8; dry run 1)")
    ap.add_argument("--group-size", type=int, default=None, help="G (default 8; dry run 2)")
    ap.add_argument("--micro-batch", type=int, default=None, help="prompts per forward/backward (default 4; dry run 1)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 128; dry run 4")
    ap.add_argument("--image-pixels", type=int, default=None, help="max_pixels (default 448*448; dry run 12544)")
    ap.add_argument("--vllm-memory", type=float, default=0.3, help="rollout.vllm_gpu_memory_utilization")
    ap.add_argument("--peak-tflops", type=float, default=None, help="bf16 peak of the GPU, for the MFU")
    ap.add_argument("--no-sync", action="store_true", help="leave out the weight-sync comparison")
    ap.add_argument("--sync-timeout", type=float, default=None, help="seconds for it (default 240; dry run 200)")
    ap.add_argument("--vllm-python", default=None, help="interpreter with vLLM for it (default: this one)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpu"))
    ap.add_argument("--work", default=None, help="folder for the model and the cells' runs (default: a temp dir)")
    args = ap.parse_args(argv)
    dry = args.dry_run
    defaults = {"budget_s": (110, 480), "steps": (1, 3), "prompts": (1, 8), "group_size": (2, 8), "micro_batch": (1, 4),
                "max_new_tokens": (4, 128), "image_pixels": (12544, 448 * 448)}
    for key, (d, g) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, d if dry else g)
    args.device = "cpu" if dry else "cuda"
    t_start = time.monotonic()

    import tempfile

    import torch

    work = Path(args.work or tempfile.mkdtemp(prefix="mmgpg-gpu-acceptance-"))
    work.mkdir(parents=True, exist_ok=True)
    size = "tiny" if dry else "shape_true"
    model = work / f"qwen2_vl-{size}"
    if not (model / "config.json").exists():
        print(f"building the {size} Qwen2-VL model in {model} ...", flush=True)
        build_model(size, model, timeout=args.budget_s)
    from mmgpg.backends.memory import model_shape

    params = model_shape(str(model)).params
    device, peak, peak_source = detect_gpu(args.device, args.peak_tflops)
    print(f"device: {device}; MFU peak: {peak_source}", flush=True)
    vllm_ok = importlib.util.find_spec("vllm") is not None
    todo = cells(dry)
    results = []
    for i, cell in enumerate(todo):
        name = cell_name(cell)
        if cell[0] == "vllm" and not vllm_ok:
            results.append({"cell": name, "status": "skipped: vllm not importable", "seconds": 0.0})
            print(f"[{name}] skipped: vllm not importable in {sys.executable}", flush=True)
            continue
        left = args.budget_s - (time.monotonic() - t_start)
        runnable_left = sum(1 for c in todo[i:] if c[0] != "vllm" or vllm_ok)
        timeout = args.cell_timeout or max(left / runnable_left, 1.0)
        run_dir = work / "runs" / name
        cmd = [sys.executable, "-m", "mmgpg", "train", *overrides(cell, model, run_dir, args)]
        print(f"[{name}] budget {timeout:.0f} s: {' '.join(cmd[2:])}", flush=True)
        status, seconds = run_cell(cmd, timeout, work / f"{name}.log")
        summary = summarise(read_metrics(run_dir), params, peak)
        results.append({"cell": name, "status": status, "seconds": seconds, "budget_s": timeout, "summary": summary,
                        "log": str(work / f"{name}.log")})
        print(f"[{name}] {status} in {seconds:.0f} s: {json.dumps(summary)}", flush=True)
    sync = {} if args.no_sync else run_sync(args, work, args.sync_timeout or (200 if dry else 240))
    if sync:
        print(f"[sync] {sync['status']}", flush=True)
    date = time.strftime("%Y-%m-%d", time.gmtime())
    result = {
        "command": "python bench/gpu_acceptance.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "device": device, "torch": torch.__version__,
        "model": f"Qwen2-VL {size} (random weights)", "parameters": params, "peak_flops": peak,
        "peak_source": peak_source, "vllm_importable": vllm_ok, "budget_s": args.budget_s,
        "elapsed_s": time.monotonic() - t_start, "dry_run": dry,
        "settings": {k: getattr(args, k) for k in ("steps", "prompts", "group_size", "micro_batch", "max_new_tokens",
                                                   "image_pixels", "vllm_memory")},
        "cells": results, "sync": sync,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slug = "".join(ch if ch.isalnum() else "-" for ch in device.lower()).strip("-")
    stem = out / f"{date}-{slug}{'-dry-run' if dry else ''}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
