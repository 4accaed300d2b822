"""One trainer for GPG, GRPO and their variants. A step reads top to bottom as its phases:

1. **rollout** — draw prompts from the deterministic stream, sample ``group_size`` completions each, score them with
   the task's rewards; while the update's valid fraction ``(B - M) / B`` is below ``algo.min_valid_fraction`` (β_th),
   draw more prompts (at most ``algo.max_resample_attempts`` attempts). The update holds exactly
   ``prompts_per_step / world_size`` groups per rank: informative groups first (attempt order), then zero-variance
   groups; informative groups beyond that are dropped and counted.
2. **advantages** — per group (:mod:`mmgpg.algorithms`); B, M and the token count of the update are summed over all
   ranks; α = B / (B - M) and the aggregation denominator come from those global counts.
3. **update** — log-probs of the forwarded groups in micro-batches (zero-variance groups carry no gradient and are
   skipped unless a KL term needs them), loss = (α · Σ policy term + kl_coef · Σ KL term) / global denominator,
   backward, gradients summed over ranks, clip, AdamW.

The phase names are the timer names (``time/rollout``, ``time/advantages``, ``time/update``).
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mmgpg import algorithms, distributed, resume
from mmgpg.checkpoint import latest_checkpoint, load_trainer_state, save_checkpoint, set_rng_state
from mmgpg.config import Config, Resolved, save_config, to_yaml
from mmgpg.data import PromptStream
from mmgpg.policy import Policy, Rollout, load_policy_for, pad_completions
from mmgpg.task import Example, SkipBadRows, build_task, first_items, task_rewards
from mmgpg.utils import resolve_device, seed_everything


@dataclass
class Group:
    """One prompt with its ``G`` completions and their rewards."""

    example: Example
    completion_ids: list[list[int]]
    texts: list[str]
    rewards: list[float]  # total reward per completion
    components: dict[str, list[float]]
    attempt: int = 0
    zero_variance: bool = False
    advantages: list[float] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(c) for c in self.completion_ids)


@dataclass
class StepState:
    """Counters that survive a resume."""

    step: int = 0
    skipped_steps: int = 0
    optimizer_steps: int = 0


class Trainer:
    def __init__(self, resolved: Resolved, *, policy: Policy | None = None, run_dir: str | Path | None = None):
        self.resolved = resolved
        self.cfg: Config = resolved.config
        cfg = self.cfg
        device = resolve_device(cfg.device)
        self.dist = distributed.setup(device.type)
        if device.type == "cuda" and self.dist.enabled:
            device = torch.device("cuda", self.dist.local_rank)
            torch.cuda.set_device(device)
        self.device = device
        self._check_layout()
        self.per_rank = cfg.train.prompts_per_step // self.dist.world_size
        self.autocast = (torch.autocast(device_type="cuda", dtype=torch.bfloat16)
                         if device.type == "cuda" and torch.cuda.is_bf16_supported() and cfg.model.dtype == "auto"
                         else contextlib.nullcontext())

        name = run_dir if run_dir is not None else cfg.output_dir or f"runs/train-{time.strftime('%Y%m%d-%H%M%S')}"
        self.run_dir = Path(distributed.broadcast_object(str(name)))
        self._check_run_dir()
        self.state = StepState()
        checkpoint = latest_checkpoint(self.run_dir) if cfg.train.resume else None

        seed_everything(cfg.seed + self.dist.rank)
        self.task = build_task(cfg.task.name, cfg.task.options)
        self.dataset = SkipBadRows(self.task.load(cfg.train.split), cfg.data.on_bad_row)
        self.stream = PromptStream(len(self.dataset), cfg.seed, self.dist.world_size, self.dist.rank)
        # Weights in float32 when bf16 autocast is used (fp32 master weights); otherwise as model.dtype says.
        dtype = "float32" if isinstance(self.autocast, torch.autocast) else cfg.model.dtype
        source = str(checkpoint / "policy") if checkpoint else cfg.model.name_or_path
        self.policy = policy or self._load(source, dtype)
        self.reference = self._load(cfg.model.name_or_path, dtype) if cfg.algo.kl_coef > 0 else None
        if self.reference is not None:
            self.reference.model.eval().requires_grad_(False)
        model = self.policy.model
        if cfg.train.freeze_vision:
            model.model.visual.requires_grad_(False)
        if cfg.train.gradient_checkpointing:
            kwargs = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:  # transformers 5.19
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.train.learning_rate, betas=tuple(cfg.train.adam_betas),
                                           eps=cfg.train.adam_eps, weight_decay=cfg.train.weight_decay)
        from transformers import get_scheduler

        self.scheduler = get_scheduler(cfg.train.lr_scheduler, self.optimizer, num_warmup_steps=cfg.train.warmup_steps,
                                       num_training_steps=cfg.train.max_steps * cfg.algo.updates_per_batch)
        if checkpoint is not None:
            self._resume(checkpoint)
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if not (cfg.train.resume and (self.run_dir / "config.yaml").exists()):  # provenance is never rewritten
                save_config(self.resolved, self.run_dir, "train")
        distributed.barrier()
        self._stop_requested = False
        self.tb = self.wandb = None

    # ---- set-up helpers -------------------------------------------------------------------------------------------

    def _check_layout(self) -> None:
        from mmgpg.config import ConfigError, Problem

        cfg, world = self.cfg, self.dist.world_size
        problems = []
        if cfg.train.prompts_per_step % world:
            problems.append(Problem("train.prompts_per_step", cfg.train.prompts_per_step,
                                    f"It must split evenly over the {world} ranks.", f"use a multiple of {world}."))
        if cfg.rollout.group_size < 2:
            problems.append(Problem("rollout.group_size", cfg.rollout.group_size,
                                    "A group of one always has zero variance and never teaches anything.",
                                    "use 2 or more (the papers use 8)."))
        if cfg.train.wandb:
            import importlib.util

            if importlib.util.find_spec("wandb") is None:
                problems.append(Problem("train.wandb", True, "The wandb package is not installed.",
                                        "pip install wandb, or set train.wandb=false."))
        if problems:
            raise ConfigError(problems)

    def _check_run_dir(self) -> None:
        if self.cfg.train.resume:
            if self.dist.is_main and resume.usable_checkpoint(self.run_dir) is None:
                moved = resume.set_aside_logs(self.run_dir)
                if moved is not None:
                    print(f"train.resume=true but {self.run_dir} has no usable checkpoint: starting from step 0; the "
                          f"earlier logs were moved to {moved}", file=sys.stderr, flush=True)
            return
        used = [p for p in ("metrics.jsonl", "checkpoints") if (self.run_dir / p).exists()]
        if used:
            raise FileExistsError(f"{self.run_dir} already holds a run ({', '.join(used)}); continue it with "
                                  "train.resume=true or choose another output_dir")

    def _load(self, source: str, dtype: str) -> Policy:
        return load_policy_for(self.cfg.model, self.device, source=source, dtype=dtype)

    def _resume(self, checkpoint: Path) -> None:
        state, rng = load_trainer_state(checkpoint)
        # Before anything is loaded: a refused config change leaves no trace.
        changed = resume.check_config(self.cfg, checkpoint, self.run_dir, record=self.dist.is_main)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.stream.load_state_dict(state["stream"])
        self.state = StepState(**state["counters"])
        if changed:  # train.resume_config=new
            resume.apply_optimizer_config(self.optimizer, self.scheduler, self.cfg.train)
        set_rng_state(rng)  # last: loading models above consumed random numbers
        if self.dist.is_main:
            resume.truncate_logs(self.run_dir, self.state.step)
        self.resumed_from = checkpoint

    # ---- phase 1: rollout -----------------------------------------------------------------------------------------

    def rollout(self) -> tuple[list[Group], dict[str, float], list[Group]]:
        """Sample until the update's valid fraction reaches β_th (or the attempt cap); return
        ``(update groups, rollout metrics, every group generated)``."""
        cfg, r = self.cfg, self.cfg.rollout
        valid: list[Group] = []
        zero: list[Group] = []
        generated: list[Group] = []
        attempts = 0
        total = cfg.train.prompts_per_step
        while True:
            indices = self.stream.next(self.per_rank)
            examples = [self.dataset[i] for i in indices]
            batch = self.policy.encode_prompts([self.task.prompt(ex) for ex in examples])
            with self.autocast:
                out = self.policy.generate(batch, r.group_size, max_new_tokens=r.max_new_tokens,
                                           temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)
            for p, ex in enumerate(examples):
                group = self._score(ex, out, p, attempts)
                generated.append(group)
                (zero if group.zero_variance else valid).append(group)
            attempts += 1
            in_update = min(len(valid), self.per_rank)
            (global_valid,) = distributed.all_sum([in_update])
            if attempts >= cfg.algo.max_resample_attempts or not algorithms.needs_more_groups(
                    total, total - global_valid, cfg.algo.min_valid_fraction):
                break
        update = valid[: self.per_rank]
        update += zero[: self.per_rank - len(update)]
        stats = {"rollout/resample_attempts": float(attempts),
                 "rollout/dropped_valid_groups": float(max(len(valid) - self.per_rank, 0))}
        return update, stats, generated

    def _score(self, example: Example, out: Rollout, p: int, attempt: int) -> Group:
        G = out.group_size
        ids, texts, rewards = [], [], []
        components: dict[str, list[float]] = {}
        for g in range(G):
            row = p * G + g
            n = int(out.completion_mask[row].sum())
            ids.append(out.completion_ids[row, :n].tolist())
            texts.append(out.texts[row])
            scores = task_rewards(self.task, out.texts[row], example)
            rewards.append(scores.pop("total"))
            for k, v in scores.items():
                components.setdefault(k, []).append(v)
        t = torch.tensor([rewards], dtype=torch.float64)
        zero = bool(algorithms.zero_variance_mask(t, self.cfg.algo.zero_variance_tol)[0])
        return Group(example, ids, texts, rewards, components, attempt, zero)

    # ---- phase 2: advantages --------------------------------------------------------------------------------------

    def advantages(self, groups: list[Group]) -> dict[str, float]:
        """Per-group advantages, then the global counts B, M, tokens → α and the aggregation denominator."""
        a, G = self.cfg.algo, self.cfg.rollout.group_size
        fn = algorithms.ADVANTAGES[a.advantage]
        for g in groups:
            g.advantages = fn(torch.tensor([g.rewards], dtype=torch.float64), a.std_eps)[0].tolist()
        local = [len(groups) * G, sum(G for g in groups if g.zero_variance), sum(g.num_tokens for g in groups)]
        num_samples, num_zero, num_tokens = distributed.all_sum(local, self._comm_device)
        informative = num_samples - num_zero
        skip = informative <= 0 and a.kl_coef == 0
        alpha = algorithms.gpg_alpha(num_samples, num_zero) if a.alpha_correction and informative > 0 else 1.0
        denominator = algorithms.aggregation_denominator(a.aggregation, int(num_samples), int(num_tokens),
                                                         self.cfg.rollout.max_new_tokens)
        return {"num_samples": num_samples, "num_zero_variance": num_zero, "num_tokens": num_tokens,
                "alpha": alpha, "denominator": denominator, "skip": float(skip),
                "valid_fraction": algorithms.valid_fraction(num_samples, num_zero)}

    @property
    def _comm_device(self) -> torch.device:
        # nccl reduces CUDA tensors only; gloo works on CPU tensors.
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    # ---- phase 3: update ------------------------------------------------------------------------------------------

    def _collate(self, groups: list[Group]) -> Rollout:
        batch = self.policy.encode_prompts([self.task.prompt(g.example) for g in groups])
        ids, mask = pad_completions([ids for g in groups for ids in g.completion_ids], self.policy.pad_token_id)
        return Rollout(batch, self.cfg.rollout.group_size, ids, mask)

    def _logprobs(self, policy: Policy, rollout: Rollout) -> torch.Tensor:
        m, r = self.cfg.model, self.cfg.rollout
        with self.autocast:
            return policy.completion_logprobs(rollout, chunk_size=m.logprob_chunk_size,
                                              temperature=r.temperature if r.temperature > 0 else 1.0,
                                              encode_images_once=m.encode_images_once)

    def update(self, groups: list[Group], counts: dict[str, float]) -> dict[str, float]:
        """Backward over this rank's forwarded groups, sum gradients over ranks, clip, step."""
        cfg, a = self.cfg, self.cfg.algo
        if counts["skip"]:
            self.state.skipped_steps += 1
            return {"loss/policy": 0.0, "loss/kl": 0.0, "grad_norm": 0.0}
        forwarded = groups if a.kl_coef > 0 else [g for g in groups if not g.zero_variance]
        mb = cfg.train.micro_batch_prompts
        micro = [self._collate(forwarded[i : i + mb]) for i in range(0, len(forwarded), mb)]
        advs = [torch.tensor([x for g in forwarded[i : i + mb] for x in g.advantages], dtype=torch.float32)
                for i in range(0, len(forwarded), mb)]
        old, ref = [None] * len(micro), [None] * len(micro)
        with torch.no_grad():
            if a.updates_per_batch > 1:  # the ratio can differ from 1 only then
                old = [self._logprobs(self.policy, r) for r in micro]
            if self.reference is not None:
                ref = [self._logprobs(self.reference, r) for r in micro]
        token_loss = algorithms.TOKEN_LOSSES[a.token_loss]
        alpha, den = counts["alpha"], counts["denominator"]
        model = self.policy.model
        model.train()
        policy_total = kl_total = 0.0
        grad_norm = 0.0
        for _ in range(a.updates_per_batch):
            policy_total = kl_total = 0.0
            for r, adv, old_lp, ref_lp in zip(micro, advs, old, ref):
                logp = self._logprobs(self.policy, r)
                adv = adv.to(logp.device)
                mask = r.completion_mask.to(logp.device)
                policy_sum = algorithms.token_loss_sum(
                    token_loss(logp, adv, old_lp, a.clip_eps), mask, a.aggregation)
                loss = alpha * policy_sum / den
                policy_total += float(loss.detach())
                if ref_lp is not None:
                    kl_term = a.kl_coef * algorithms.token_loss_sum(algorithms.kl_k3(logp, ref_lp), mask, a.aggregation) / den
                    loss = loss + kl_term
                    kl_total += float(kl_term.detach())
                loss.backward()
            distributed.sum_gradients(self.params)
            if cfg.train.max_grad_norm > 0:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, cfg.train.max_grad_norm))
            else:
                grad_norm = float(torch.linalg.vector_norm(torch.stack(
                    [p.grad.norm() for p in self.params if p.grad is not None])) if self.params else 0.0)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.state.optimizer_steps += 1
        model.eval()
        policy_total, kl_total = distributed.all_sum([policy_total, kl_total], self._comm_device)
        return {"loss/policy": policy_total, "loss/kl": kl_total, "grad_norm": grad_norm}

    # ---- one step -------------------------------------------------------------------------------------------------

    def train_step(self) -> dict[str, Any]:
        timings: dict[str, float] = {}
        t_step = t0 = time.perf_counter()
        groups, rollout_stats, generated = self.rollout()
        timings["time/rollout"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        counts = self.advantages(groups)
        timings["time/advantages"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        update_stats = self.update(groups, counts)
        timings["time/update"] = time.perf_counter() - t0
        self.state.step += 1
        timings["time/step"] = time.perf_counter() - t_step
        metrics = self._metrics(generated, counts, rollout_stats, update_stats, timings)
        self._write_success_records(generated)
        return metrics

    def _metrics(self, generated: list[Group], counts, rollout_stats, update_stats, timings) -> dict[str, Any]:
        G = self.cfg.rollout.group_size
        names = sorted(generated[0].components) if generated else []
        local = [float(len(generated) * G), sum(sum(g.rewards) for g in generated),
                 float(sum(g.num_tokens for g in generated)),
                 float(sum(len(c) == self.cfg.rollout.max_new_tokens for g in generated for c in g.completion_ids))]
        local += [sum(sum(g.components[n]) for g in generated) for n in names]
        summed = distributed.all_sum(local, self._comm_device)
        n = max(summed[0], 1.0)
        metrics: dict[str, Any] = {"step": self.state.step, "reward/total": summed[1] / n}
        metrics.update({f"reward/{name}": summed[4 + i] / n for i, name in enumerate(names)})
        metrics.update({
            "gpg/alpha": counts["alpha"], "gpg/valid_fraction": counts["valid_fraction"],
            "gpg/skipped_steps": self.state.skipped_steps, "gpg/num_samples": counts["num_samples"],
            "gpg/num_zero_variance": counts["num_zero_variance"],
            "rollout/completion_tokens": summed[2] / n, "rollout/truncated_fraction": summed[3] / n,
            **rollout_stats, **update_stats, "lr": self.scheduler.get_last_lr()[0], **timings,
            "throughput/completion_tokens_per_s": summed[2] / max(timings["time/step"], 1e-9),
        })
        return metrics

    # ---- logging --------------------------------------------------------------------------------------------------

    def _open_writers(self) -> None:
        self.tb = self.wandb = None
        if not self.dist.is_main:
            return
        if self.cfg.train.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=self.state.step + 1)
        if self.cfg.train.wandb:
            import wandb

            from mmgpg.config import to_dict

            self.wandb = wandb.init(project=self.cfg.train.wandb_project, dir=str(self.run_dir),
                                    config=to_dict(self.cfg), resume="allow")

    def _log(self, metrics: dict[str, Any]) -> None:
        if not self.dist.is_main:
            return
        if getattr(self.dataset, "skipped", None):  # data.on_bad_row=skip: rows rank 0 skipped so far
            metrics["data/skipped_rows"] = len(self.dataset.skipped)
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        step = metrics["step"]
        if self.tb is not None:
            for k, v in metrics.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def _write_success_records(self, generated: list[Group]) -> None:
        key = self.cfg.train.success_reward
        records = [{"step": self.state.step, "prompt_id": g.example.id, "attempt": g.attempt, "rank": self.dist.rank,
                    "successes": sum(1 for v in g.components.get(key, g.rewards) if v >= 1.0),
                    "group_size": len(g.rewards)} for g in generated]
        everyone = distributed.gather_objects(records)
        if self.dist.is_main:
            with open(self.run_dir / "prompt_success.jsonl", "a") as f:
                for recs in everyone:
                    for rec in recs:
                        f.write(json.dumps(rec) + "\n")

    def evaluate(self) -> dict[str, float]:
        """Greedy evaluation on ``train.eval_split`` (rank 0 evaluates, every rank gets the numbers)."""
        from mmgpg.evaluate import evaluate, sampled_scores

        metrics = None
        if self.dist.is_main:
            t, r = self.cfg.train, self.cfg.rollout
            examples = first_items(self.task.load(t.eval_split), t.eval_limit)
            # Evaluation must not move the training RNG stream (resume exactness): sample under a forked RNG.
            with self.autocast, torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                scores, _ = evaluate(self.policy, self.task, examples, max_new_tokens=r.max_new_tokens)
                metrics = {f"eval/{k}": v for k, v in scores.items()}
                if t.eval_samples:
                    torch.manual_seed(self.cfg.seed + 10_000 + self.state.step)
                    sampled = sampled_scores(self.policy, self.task, examples, samples=t.eval_samples,
                                             temperature=r.temperature or 1.0, max_new_tokens=r.max_new_tokens)
                    metrics.update({f"eval/sampled_{k}": v for k, v in sampled.items()})
        return distributed.broadcast_object(metrics)

    def save(self) -> Path:
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "stream": self.stream.state_dict(), "counters": vars(self.state).copy()}
        return save_checkpoint(self.run_dir, self.state.step, self.policy, state, self.cfg.train.keep_last,
                               extra_files={"config.yaml": to_yaml(self.cfg)})

    def _request_stop(self, signum, frame) -> None:
        if self._stop_requested and signum == signal.SIGINT:  # a second Ctrl-C aborts at once, without saving
            raise KeyboardInterrupt
        self._stop_requested = True
        if self.dist.is_main:
            print(f"\n{signal.Signals(signum).name}: stopping after step {self.state.step + 1} with a checkpoint; "
                  "press Ctrl-C again to abort now without saving", file=sys.stderr, flush=True)

    # ---- the loop -------------------------------------------------------------------------------------------------

    def train(self) -> Path:
        """Run until ``train.max_steps``; save at ``save_every``, at the end, and at a SIGTERM/SIGINT step boundary."""
        cfg = self.cfg
        self._open_writers()
        previous = {s: signal.signal(s, self._request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
        progress = _Progress(cfg.train.max_steps, self.state.step, enabled=cfg.train.progress and self.dist.is_main)
        if not self.dist.is_main:
            progress.note = lambda text: None  # type: ignore[method-assign]
        try:
            if cfg.train.eval_every and self.state.step == 0:
                self._log({"step": 0, **self.evaluate()})
            while self.state.step < cfg.train.max_steps:
                metrics = self.train_step()
                if cfg.train.eval_every and (self.state.step % cfg.train.eval_every == 0
                                             or self.state.step == cfg.train.max_steps):
                    metrics.update(self.evaluate())
                self._log(metrics)
                progress.update(metrics)
                last = self.state.step >= cfg.train.max_steps
                stop = distributed.all_max(float(self._stop_requested), self._comm_device) > 0
                if last or stop or (cfg.train.save_every and self.state.step % cfg.train.save_every == 0):
                    self.save()
                if stop:
                    progress.note(f"stopped by signal at step {self.state.step}; checkpoint saved")
                    break
        finally:
            progress.close()
            for s, handler in previous.items():
                signal.signal(s, handler)
            if self.tb is not None:
                self.tb.close()
            if self.wandb is not None:
                self.wandb.finish()
        return self.run_dir


class _Progress:
    """A rich progress bar with step, reward, valid fraction, α and s/step (rank 0 only)."""

    def __init__(self, total: int, start: int, enabled: bool):
        self.bar = None
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                            TimeRemainingColumn())
        self.task = self.bar.add_task("train", total=total, completed=start, info="")
        self.bar.start()

    def update(self, m: dict[str, Any]) -> None:
        if self.bar is None:
            return
        info = (f"reward {m['reward/total']:.3f}  valid {m['gpg/valid_fraction']:.2f}  α {m['gpg/alpha']:.2f}  "
                f"{m['time/step']:.2f} s/step")
        self.bar.update(self.task, completed=m["step"], info=info)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.console.print(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
