"""Step time and peak memory of mmgpg's GPG step next to TRL's ``GRPOTrainer`` set as close to GPG as TRL allows.

Performance is measured here, never asserted in tests.

    python bench/trl_peer.py                          # defaults: P=2 prompts x G=8, 32 new tokens, 10 steps, 3 pairs
    python bench/trl_peer.py --repeats 5 --steps 12   # more pairs for a steadier ratio

What is shared. The script builds the ~1 M-parameter tiny Qwen2-VL once (:func:`mmgpg.models.tiny.build_and_save`, random
init, offline) into a temporary directory; both sides load that directory. Both train on the first ``--num-prompts``
items (default ``steps x P``) of the ``shapes`` train split (:class:`mmgpg_tasks.shapes.ShapesTask`) and see the same
prompts in the same order: the TRL dataset is laid out in mmgpg's :class:`mmgpg.rollout.stream.PromptStream` order and TRL does
not shuffle it (the ids each side used are recorded and checked equal). Both use P prompts x G completions per
optimizer step, at most ``--max-new-tokens`` new tokens, lr 1e-4 constant without warmup, AdamW (torch, not fused,
weight decay 0), gradient clipping at 1.0, float32, temperature 1, top_p 1, top_k 0, the five vision special tokens
suppressed in sampling, seed 0, ``--threads`` torch threads. A random-init model never answers the shapes question,
so both use the same length-parity reward: 1.0 when the decoded completion (special tokens skipped) has an even
number of characters, else 0 -- groups have reward variance and both sides really backpropagate.

mmgpg side: ``Trainer(resolve([...]))`` with ``algo=gpg`` plus ``algo.min_valid_fraction=0`` (no resampling: P x G
completions per step, like TRL), ``algo.aggregation=seq_mean_token_mean`` (TRL's ``loss_type="grpo"``),
``train.prompts_per_step=P``, ``train.micro_batch_prompts=P`` (one forward/backward), ``train.tensorboard=false``,
``train.progress=false``, ``model.dtype=float32``, ``model.min_pixels=3136``, ``model.max_pixels=12544`` (the tiny
processor's own bounds, which TRL uses), ``device=cpu``, and the built-in task ``shapes_parity``
(``mmgpg_tasks.shapes.ShapesParityTask``; reward ``length_parity``). Each ``trainer.train_step()`` is timed (it includes drawing the
images, encoding, rollout, rewards, advantages, update and per-step records). Algorithmic differences that are part
of what is measured: mmgpg applies GPG's alpha = B/(B-M) (free) and skips zero-variance groups in the backward; it
encodes each prompt's image once in the training forward and excludes the suppressed tokens from the scored softmax.

TRL side (trl 1.16): ``GRPOTrainer(model=<dir>, reward_funcs=[parity_reward], args=GRPOConfig(...))`` with
``use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, beta=0.0, scale_rewards="none",
num_iterations=1, loss_type="grpo", num_generations=G, per_device_train_batch_size=P*G,
gradient_accumulation_steps=1, max_completion_length=T, use_vllm=False, temperature=1.0, top_p=1.0, top_k=0,
generation_kwargs={"suppress_tokens": <vision ids>}, learning_rate, lr_scheduler_type="constant", warmup_steps=0,
weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch", max_steps=N, logging_steps=1, report_to="none",
save_strategy="no", dataloader_num_workers=0, shuffle_dataset=False, seed=0, log_completions=False,
disable_tqdm=True``; dataset rows are ``{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text",
"text": <question>}]}], "image": <PIL image>, "id": ...}`` (TRL fills the placeholder from ``image``). A
``TrainerCallback`` times each step: "full" is the interval between consecutive ``on_step_end`` calls (it includes
fetching the batch and logging, like mmgpg's ``train_step``), "core" is ``on_step_begin`` -> ``on_step_end``. With
beta 0, no scaling and one iteration this is A = r - group mean, no KL, ratio 1: GPG without alpha. TRL also computes
the token entropy in its training forward and encodes every image G times in both generation and training.

"Same process run": one invocation runs both. Each framework trains in a child process of this script (``--child
mmgpg|trl``) so that peak memory is clean; pairs alternate the order (mmgpg, trl, trl, mmgpg, ...). A child reports
the wall time of every step and its peak RSS (``ru_maxrss``) after imports + model/data/trainer set-up and after
training. Reported: the median of steps 3..N per run, the median over runs, the per-pair ratio TRL/mmgpg (median and
range), peak-RSS growth during training (and its ratio), absolute peaks, mean reward, zero-variance group fraction,
mean completion length and gradient norm (to show both sides made real updates). Results go to
``bench/results/trl_peer.md`` (``--out``). Run-to-run noise on the 2-core VM is about +-25 % per run; read the
paired ratios.

Other work on the machine ruins the numbers: with 2 torch threads on 2 cores, one busy core elsewhere made steps
3-60x slower here (TRL far more than mmgpg). So each child waits (``--wait-idle``) until other processes leave the
CPU, measures how many cores others kept busy while it trained (from ``/proc/stat``), and a disturbed pair is run
again (``--retries``); pairs still disturbed are flagged in the report.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mmgpg_tasks.shapes import ShapesTask, length_parity

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parent.parent
BUSY = 0.15  # mean cores used by other processes during a run above which the run is flagged
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _cpu_snapshot() -> tuple[float, float, float]:
    """(wall s, CPU s used by the whole machine, CPU s used by this process) for :func:`_other_load`."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    hz = os.sysconf("SC_CLK_TCK")
    me = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), (user + nice + system + irq + softirq + steal) / hz, me.ru_utime + me.ru_stime


def _other_load(start: tuple[float, float, float]) -> float:
    """Mean number of cores other processes (and the hypervisor, as steal) kept busy since ``start``.

    On 2 cores with 2 torch threads, anything above ~0.1 slows the run: a concurrent job here was seen to make the
    same steps 30-60x slower (OpenMP threads spinning against each other), so such runs are flagged in the report.
    """
    end = _cpu_snapshot()
    return max(0.0, (end[1] - start[1]) - (end[2] - start[2])) / max(end[0] - start[0], 1e-9)


def prompt_order(num_prompts: int, prompts_per_step: int, steps: int, seed: int) -> list[int]:
    """Item indices in the order mmgpg's single-rank prompt stream draws them (one draw per step, no resampling)."""
    from mmgpg.rollout.stream import PromptStream

    stream = PromptStream(num_prompts, seed)
    return [i for _ in range(steps) for i in stream.next(prompts_per_step)]


# --------------------------------------------------------------------------------------------------------------------
# Children
# --------------------------------------------------------------------------------------------------------------------


def mmgpg_overrides(a: argparse.Namespace, run_dir: Path) -> list[str]:
    """mmgpg's config for the measured step (the module docstring's "mmgpg side"; bench/profile_step.py profiles
    the same step)."""
    return [
        "algo=gpg", "task=shapes_parity", f"task.num_train={a.num_prompts}",
        f"model.name_or_path={a.model}", "model.dtype=float32", "model.min_pixels=3136", "model.max_pixels=12544",
        f"rollout.group_size={a.group_size}", f"rollout.max_new_tokens={a.max_new_tokens}", "rollout.temperature=1.0",
        "rollout.top_p=1.0", "rollout.top_k=0",
        "algo.min_valid_fraction=0", "algo.aggregation=seq_mean_token_mean",
        f"train.prompts_per_step={a.prompts}", f"train.micro_batch_prompts={a.prompts}", f"train.max_steps={a.steps}",
        f"train.learning_rate={a.lr}", "train.lr_scheduler=constant", "train.warmup_steps=0", "train.weight_decay=0.0",
        "train.max_grad_norm=1.0", "train.tensorboard=false", "train.progress=false",
        f"output_dir={run_dir}", f"seed={a.seed}", "device=cpu",
    ]


def child_mmgpg(a: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    # mmgpg imports transformers lazily; import what its set-up uses now, so that "after imports" means the same on
    # both sides (the TRL child has transformers, datasets and trl loaded at that point).
    import qwen_vl_utils  # noqa: F401
    from transformers import AutoModelForImageTextToText, AutoProcessor, get_scheduler  # noqa: F401

    from mmgpg.config import resolve
    from mmgpg.train.trainer import Trainer

    rss_imports = _maxrss_mib()
    run_dir = Path(a.run_dir)  # the Trainer creates it
    t0 = time.perf_counter()
    trainer = Trainer(resolve(mmgpg_overrides(a, run_dir)))
    init_s = time.perf_counter() - t0
    rss_setup = _maxrss_mib()
    steps, metrics = [], []
    cpu0 = _cpu_snapshot()
    for _ in range(a.steps):
        t0 = time.perf_counter()
        m = trainer.train_step()
        steps.append(time.perf_counter() - t0)
        metrics.append(m)
    rss_peak = _maxrss_mib()
    other_load = _other_load(cpu0)
    ids: dict[int, list[str]] = {}
    with open(run_dir / "prompt_success.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            ids.setdefault(rec["step"], []).append(rec["prompt_id"])
    return {
        "side": "mmgpg", "suppressed": trainer.policy.vision_token_ids, "step_s": steps, "init_s": init_s, "other_load": other_load, "threads": torch.get_num_threads(),
        "rss_imports": rss_imports, "rss_setup": rss_setup, "rss_peak": rss_peak,
        "reward": [m["reward/total"] for m in metrics],
        "zero_var_frac": [m["gpg/num_zero_variance"] / m["gpg/num_samples"] for m in metrics],
        "completion_tokens": [m["rollout/completion_tokens"] for m in metrics],
        "grad_norm": [m["grad_norm"] for m in metrics],
        "alpha": [m["gpg/alpha"] for m in metrics],
        "rollout_s": [m["time/rollout"] for m in metrics], "update_s": [m["time/update"] for m in metrics],
        "prompt_ids": [ids[s] for s in sorted(ids)],
    }


def child_trl(a: argparse.Namespace) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rss_imports = _maxrss_mib()
    task = ShapesTask(num_train=a.num_prompts, seed=0)
    order = prompt_order(a.num_prompts, a.prompts, a.steps, a.seed)
    rows = []
    for i in order:
        ex = task.example("train", i)
        rows.append({"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": ex.question}]}],
                     "image": ex.images[0], "id": ex.id})
    dataset = Dataset.from_list(rows)
    seen_ids: list[list[str]] = []

    def parity_reward(completions, **kwargs):  # TRL passes the dataset columns (here `id`) as keyword arguments
        seen_ids.append(list(dict.fromkeys(kwargs["id"])))  # each prompt appears G times, consecutively
        return [length_parity(c[0]["content"]) for c in completions]

    tok = AutoTokenizer.from_pretrained(a.model)
    suppress = [tok.convert_tokens_to_ids(t) for t in VISION_TOKENS]
    cfg = GRPOConfig(
        output_dir=a.run_dir, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        beta=0.0, scale_rewards="none", num_iterations=1, loss_type="grpo",
        num_generations=a.group_size, per_device_train_batch_size=a.prompts * a.group_size,
        gradient_accumulation_steps=1, max_completion_length=a.max_new_tokens,
        use_vllm=False, temperature=1.0, top_p=1.0, top_k=0, generation_kwargs={"suppress_tokens": suppress},
        learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch", max_steps=a.steps, logging_steps=1, report_to="none", save_strategy="no",
        dataloader_num_workers=0, shuffle_dataset=False, seed=a.seed, log_completions=False, disable_tqdm=True,
    )
    t0 = time.perf_counter()
    trainer = GRPOTrainer(model=a.model, reward_funcs=[parity_reward], args=cfg, train_dataset=dataset)
    init_s = time.perf_counter() - t0
    rss_setup = _maxrss_mib()

    class Timer(TrainerCallback):
        def __init__(self):
            self.begin: list[float] = []
            self.end: list[float] = []
            self.logs: list[dict] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            self.end.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.logs.append(dict(logs))

    timer = Timer()
    trainer.add_callback(timer)
    cpu0 = _cpu_snapshot()
    trainer.train()
    rss_peak = _maxrss_mib()
    other_load = _other_load(cpu0)
    b, e = timer.begin, timer.end
    full = [e[0] - b[0]] + [e[k] - e[k - 1] for k in range(1, len(e))]  # step 1 has no previous end: core time
    logs = timer.logs
    return {
        "side": "trl", "suppressed": list(trainer.generation_config.suppress_tokens or []), "step_s": full, "core_s": [y - x for x, y in zip(b, e)], "init_s": init_s, "other_load": other_load,
        "threads": torch.get_num_threads(), "model_dtype": str(trainer.model.dtype),
        "rss_imports": rss_imports, "rss_setup": rss_setup, "rss_peak": rss_peak,
        "reward": [g["reward"] for g in logs], "zero_var_frac": [g["frac_reward_zero_std"] for g in logs],
        "completion_tokens": [g["completions/mean_length"] for g in logs],
        "grad_norm": [g.get("grad_norm", float("nan")) for g in logs],
        "trl_step_time": [g.get("step_time", float("nan")) for g in logs],
        "prompt_ids": seen_ids,
    }


# --------------------------------------------------------------------------------------------------------------------
# Parent
# --------------------------------------------------------------------------------------------------------------------


def _median_steps(values: list[float]) -> float:
    return statistics.median(values[2:] if len(values) > 2 else values)  # steps 3..N


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def wait_for_idle(limit_s: float) -> float:
    """Sleep until other processes use under ``BUSY`` cores over a 2 s window (at most ``limit_s``); the seconds waited."""
    t0 = time.perf_counter()
    while True:
        start = _cpu_snapshot()
        time.sleep(2.0)
        if _other_load(start) < BUSY or time.perf_counter() - t0 > limit_s:
            return time.perf_counter() - t0 - 2.0


def run_child(side: str, a: argparse.Namespace, model: Path, scratch: Path, tag: str) -> dict:
    waited = wait_for_idle(a.wait_idle)
    if waited > 1:
        print(f"  waited {waited:.0f} s for other processes to leave the CPU before {tag}", flush=True)
    out = scratch / f"{tag}.json"
    cmd = [sys.executable, str(SCRIPT), "--child", side, "--model", str(model), "--run-dir", str(scratch / tag),
           "--json", str(out), "--steps", str(a.steps), "--prompts", str(a.prompts), "--group-size", str(a.group_size),
           "--max-new-tokens", str(a.max_new_tokens), "--lr", str(a.lr), "--num-prompts", str(a.num_prompts),
           "--threads", str(a.threads), "--seed", str(a.seed)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", HF_DATASETS_CACHE=str(scratch / "hf_datasets"))
    t0 = time.perf_counter()
    with open(scratch / f"{tag}.log", "w") as log:
        rc = subprocess.run(cmd, cwd=scratch, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        sys.exit(f"child {tag} failed (exit {rc}); its log:\n" + (scratch / f"{tag}.log").read_text()[-6000:])
    result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - t0
    return result


def summarize(a: argparse.Namespace, runs: list[tuple[str, dict, dict]], command: str, versions: dict, date: str,
              params: int, total_s: float, discarded: int = 0) -> str:
    mm = [r[1] for r in runs]
    tr = [r[2] for r in runs]
    mm_t = [_median_steps(r["step_s"]) for r in mm]
    tr_t = [_median_steps(r["step_s"]) for r in tr]
    tr_core = [_median_steps(r["core_s"]) for r in tr]
    ratios = [t / m for t, m in zip(tr_t, mm_t)]
    mm_g = [r["rss_peak"] - r["rss_setup"] for r in mm]
    tr_g = [r["rss_peak"] - r["rss_setup"] for r in tr]
    mem_ratios = [t / m if m > 0 else float("inf") for t, m in zip(tr_g, mm_g)]
    med = statistics.median
    same = all(m["prompt_ids"] == t["prompt_ids"] for m, t in zip(mm, tr))

    def mean_of(side: list[dict], key: str, fmt: str) -> str:
        return format(_mean([_mean(r[key]) for r in side]), fmt)

    def both(key: str, fmt: str) -> tuple[str, str]:
        return mean_of(mm, key, fmt), mean_of(tr, key, fmt)

    def span(xs: list[float], fmt: str = ".2f") -> str:
        return f"{format(min(xs), fmt)}-{format(max(xs), fmt)}"

    lines = [
        "# mmgpg GPG step vs TRL GRPOTrainer (closest-to-GPG settings), tiny Qwen2-VL on CPU",
        "",
        f"Command: `{command}` (from the repository root; {total_s / 60:.1f} min).",
        f"Date: {date}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        f"Setup: tiny Qwen2-VL ({params / 1e6:.2f} M params, random init, float32), P={a.prompts} prompts x "
        f"G={a.group_size} completions per step, <= {a.max_new_tokens} new tokens, {a.steps} steps, "
        f"{a.num_prompts} shapes prompts (same order on both sides: {'checked' if same else 'MISMATCH'}), "
        f"length-parity reward, lr {a.lr:g}, suppressed token ids {mm[0]['suppressed']} (mmgpg) / "
        f"{tr[0]['suppressed']} (TRL), {a.threads} threads, {a.repeats} pairs of child processes "
        "(order alternates mmgpg/trl). How each side is configured: the docstring of bench/trl_peer.py.",
        "",
        "| | mmgpg | TRL | TRL/mmgpg |",
        "|---|---:|---:|---:|",
        f"| step s (median of steps 3..N, median over runs) | {med(mm_t):.3f} | {med(tr_t):.3f} | "
        f"**{med(tr_t) / med(mm_t):.2f}** |",
        f"| paired ratio, median [range] over {a.repeats} pairs | | | **{med(ratios):.2f}** [{span(ratios)}] |",
        f"| per-run step s range | {span(mm_t, '.3f')} | {span(tr_t, '.3f')} | |",
        f"| TRL core step s (on_step_begin -> on_step_end, no batch fetch/logging) | | {med(tr_core):.3f} | "
        f"{med(tr_core) / med(mm_t):.2f} |",
        f"| peak RSS growth during training MiB (median) | {med(mm_g):.0f} | {med(tr_g):.0f} | "
        f"**{med(tr_g) / med(mm_g):.2f}** (paired median {med(mem_ratios):.2f}) |",
        f"| peak RSS MiB, absolute (median) | {med([r['rss_peak'] for r in mm]):.0f} | "
        f"{med([r['rss_peak'] for r in tr]):.0f} | {med([r['rss_peak'] for r in tr]) / med([r['rss_peak'] for r in mm]):.2f} |",
        f"| RSS after imports / after set-up MiB (median) | {med([r['rss_imports'] for r in mm]):.0f} / "
        f"{med([r['rss_setup'] for r in mm]):.0f} | {med([r['rss_imports'] for r in tr]):.0f} / "
        f"{med([r['rss_setup'] for r in tr]):.0f} | |",
        f"| trainer set-up s (median) | {med([r['init_s'] for r in mm]):.2f} | {med([r['init_s'] for r in tr]):.2f} | |",
        "| mean reward (all steps, all runs) | {} | {} | |".format(*both("reward", ".3f")),
        "| zero-variance group fraction | {} | {} | |".format(*both("zero_var_frac", ".3f")),
        "| mean completion tokens | {} | {} | |".format(*both("completion_tokens", ".1f")),
        "| mean grad norm (before clipping) | {} | {} | |".format(*both("grad_norm", ".3f")),
        "",
        f"mmgpg phases (median over steps 3..N and runs): rollout {med([_median_steps(r['rollout_s']) for r in mm]):.3f} s, "
        f"update {med([_median_steps(r['update_s']) for r in mm]):.3f} s; mean alpha {mean_of(mm, 'alpha', '.3f')}. "
        f"TRL's own `step_time` metric (training_step only): {med([_median_steps(r['trl_step_time']) for r in tr]):.3f} s.",
        "",
        "| pair | order | mmgpg s | TRL s | TRL/mmgpg | mmgpg RSS growth MiB | TRL RSS growth MiB "
        "| other load, cores (mmgpg / TRL) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for i, (order, m, t) in enumerate(runs):
        lines.append(f"| {i + 1} | {order} | {mm_t[i]:.3f} | {tr_t[i]:.3f} | {ratios[i]:.2f} | {mm_g[i]:.0f} | "
                     f"{tr_g[i]:.0f} | {m['other_load']:.2f} / {t['other_load']:.2f} |")
    if discarded:
        lines += ["", f"{discarded} pair run(s) disturbed by other processes (> {BUSY} cores busy) were discarded and "
                  "run again."]
    busy = [i + 1 for i, (_, m, t) in enumerate(runs) if max(m["other_load"], t["other_load"]) > BUSY]
    if busy:
        lines += ["", f"**Warning: other processes kept more than {BUSY} cores busy during pair(s) "
                  f"{', '.join(map(str, busy))}; their step times are not clean. Rerun on an idle machine.**"]
    lines += [
        "",
        "Step s is whole-step wall time: mmgpg's `Trainer.train_step()`; TRL's interval between consecutive "
        "`on_step_end` callbacks (batch fetch, generation, rewards, forward, backward, clip, AdamW, logging). RSS is "
        "`ru_maxrss` in each child; growth = peak after training minus the peak after imports + model, data and "
        "trainer set-up. Noise: on this 2-core VM per-run medians move by about +-25 % from run to run in both "
        "frameworks, even on an idle machine, so read the paired ratios and their range, not one run. "
        "Performance is measured here, never asserted in tests.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=2, help="prompts per optimizer step (P)")
    ap.add_argument("--group-size", type=int, default=8, help="completions per prompt (G)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--num-prompts", type=int, default=0, help="first K shapes train items (default steps x P)")
    ap.add_argument("--repeats", type=int, default=3, help="pairs of runs (one mmgpg, one TRL each)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "trl_peer.md"), help="'' to skip writing")
    ap.add_argument("--wait-idle", type=float, default=300,
                    help="before each child, wait up to this many seconds for other processes to leave the CPU")
    ap.add_argument("--retries", type=int, default=2,
                    help="run a pair again (at most this many times) when other processes disturbed it")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (model, runs, child logs)")
    ap.add_argument("--child", choices=["mmgpg", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.num_prompts = a.num_prompts or a.steps * a.prompts
    if a.steps < 3:
        ap.error("--steps must be >= 3 (steps 1-2 are warm-up)")

    if a.child:
        result = child_mmgpg(a) if a.child == "mmgpg" else child_trl(a)
        Path(a.json).write_text(json.dumps(result))
        return

    import torch
    import transformers
    import trl

    from mmgpg.models.tiny import build_and_save, count_parameters

    command = "python bench/trl_peer.py" + "".join(f" {x}" for x in sys.argv[1:])
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
                "python": sys.version.split()[0]}
    date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    scratch = Path(tempfile.mkdtemp(prefix="trl_peer-"))
    t_start = time.perf_counter()
    try:
        model_dir = build_and_save(scratch / "tiny_qwen2vl", family="qwen2_vl")
        from transformers import Qwen2VLForConditionalGeneration

        params = count_parameters(Qwen2VLForConditionalGeneration.from_pretrained(model_dir))["total"]
        print(f"tiny model ({params / 1e6:.2f} M params) in {model_dir}; scratch {scratch}", flush=True)
        runs, discarded = [], 0
        for i in range(a.repeats):
            order = ("mmgpg", "trl") if i % 2 == 0 else ("trl", "mmgpg")
            for attempt in range(a.retries + 1):
                tag = f"r{i + 1}" + (f"-retry{attempt}" if attempt else "")
                res = {side: run_child(side, a, model_dir, scratch, f"{side}-{tag}") for side in order}
                load = max(res["mmgpg"]["other_load"], res["trl"]["other_load"])
                print(f"pair {i + 1} ({'/'.join(order)}): mmgpg {_median_steps(res['mmgpg']['step_s']):.3f} s/step, "
                      f"TRL {_median_steps(res['trl']['step_s']):.3f} s/step; other load "
                      f"{res['mmgpg']['other_load']:.2f} / {res['trl']['other_load']:.2f} cores", flush=True)
                if load <= BUSY or attempt == a.retries:
                    break
                discarded += 1
                print(f"  pair {i + 1} was disturbed by other processes; running it again", flush=True)
            runs.append(("/".join(order), res["mmgpg"], res["trl"]))
        report = summarize(a, runs, command, versions, date, params, time.perf_counter() - t_start, discarded)
    finally:
        if a.keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    print(report)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(report)
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
