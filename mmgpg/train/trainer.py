"""One trainer for GPG, GRPO and their variants. A step reads top to bottom as its phases:

1. **rollout** — draw prompts from the deterministic stream, sample ``group_size`` completions each, score them with
   the task's rewards; while the update's valid fraction ``(B - M) / B`` is below ``algo.min_valid_fraction`` (β_th),
   draw more prompts (at most ``algo.max_resample_attempts`` attempts). The update holds exactly
   ``prompts_per_step / world_size`` groups per rank: informative groups first (attempt order), then zero-variance
   groups (none with ``algo.drop_zero_variance``, DAPO's dynamic sampling); informative groups beyond that are dropped
   and counted.
2. **advantages** — :class:`mmgpg.train.objective.Objective`: per group, or whitened with the batch's moments summed
   over all ranks (REINFORCE++); B, M and the token count of the update are summed over all ranks; α = B / (B - M)
   and the aggregation denominator come from those global counts.
3. **update** — log-probs of the trained groups in micro-batches (zero-variance groups carry no gradient under a
   group-relative advantage and are skipped unless a KL term needs them), loss = (α · Σ policy term + kl_coef · Σ KL
   term) / global denominator, backward, gradients summed over ranks, clip, AdamW (``algo.updates_per_batch`` times,
   with old log-probs computed once when it is above 1).

The phase names are the timer names (``time/rollout``, ``time/advantages``, ``time/update``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mmgpg import algorithms, distributed, rundir
from mmgpg import correction as rollout_correction
from mmgpg.backends import OptimizerSettings, build_backend
from mmgpg.config import Config, Resolved, save_config
from mmgpg.models import Policy, lora
from mmgpg.models.batch import CompletionBatch
from mmgpg.models.load import load_for_training, load_policy_for
from mmgpg.rollout import EngineSettings, build_engine
from mmgpg.rollout.check import LogprobDiff, check_logprob_diff
from mmgpg.rollout.collect import (
    Collected,
    Group,
    check_packing,
    collate_groups,
    group_logprobs,
    packs,
    padding_counts,
    plan_micro_batches,
)
from mmgpg.rollout.episode import episode_means, group_episode_sums
from mmgpg.rollout.pipeline import AsyncRollout, staleness_metrics
from mmgpg.rollout.producer import ProducerSettings, RolloutProducer
from mmgpg.rollout.stream import PromptStream
from mmgpg.rundir import SuccessRecord, run_dir_path
from mmgpg.task import SkipBadRows, check_task_for_model
from mmgpg.train import live, resume
from mmgpg.train.objective import Objective, StepCounts
from mmgpg.train.runlog import RunLog, planned_memory
from mmgpg.utils import GracefulStop, PeakMemory, seed_everything


@dataclass
class StepState:
    """Counters that survive a resume."""

    step: int = 0
    skipped_steps: int = 0  # steps whose update had no informative group (and no KL term): no optimizer step
    optimizer_steps: int = 0
    nonfinite_steps: int = 0  # optimizer steps skipped because the loss or gradient norm was NaN/Inf
    nonfinite_streak: int = 0  # consecutive ones, for train.max_nonfinite_steps


class NonFiniteError(ValueError):
    """Training produced NaN/Inf losses or gradients for more consecutive steps than train.max_nonfinite_steps."""


class Trainer:
    def __init__(self, resolved: Resolved, *, policy: Policy | None = None, run_dir: str | Path | None = None):
        self.resolved = resolved
        self.cfg: Config = resolved.config
        cfg = self.cfg
        self.backend = build_backend(cfg.train.backend, cfg)  # device, process group, mixed precision
        self.dist, self.device = self.backend.dist, self.backend.device
        self._check_layout()
        self.per_rank = cfg.train.prompts_per_step // self.dist.world_size

        name = run_dir if run_dir is not None else run_dir_path(cfg.output_dir, "train")
        self.run_dir = Path(distributed.broadcast_object(str(name)))
        self.lock = resume.lock_run(self.run_dir, "train", self.dist.is_main)  # released at the end of train()
        checkpoint = resume.start_or_resume(self.run_dir, cfg.train.resume, is_main=self.dist.is_main)
        if checkpoint is not None:  # a config the checkpoint cannot continue with is refused before loading anything
            resume.check_config(cfg, checkpoint, self.run_dir, record=False, command="train")
        self.state = StepState()

        seed_everything(cfg.seed + self.dist.rank)
        self.task = resolved.build_task()
        self.dataset = SkipBadRows(self.task.load(cfg.train.split), cfg.data.on_bad_row)
        self.stream = PromptStream(len(self.dataset), cfg.seed, self.dist.world_size, self.dist.rank)
        dtype = self.backend.weights_dtype(cfg.model.dtype)
        # Loading draws the same numbers on every rank (a fresh LoRA adapter's random A): every rank must start from
        # the same model, which the backends never broadcast. The ranks' own streams (sampling) continue afterwards.
        # ZeRO-3 (backend.loading): the policy and the reference are built partitioned, never whole on one rank.
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []), self.backend.loading():
            torch.manual_seed(cfg.seed)
            self.policy = load_for_training(cfg.model, self.device, dtype, checkpoint, policy=policy)
        check_task_for_model(self.task, self.policy.spec)  # e.g. a grounding task's box convention
        # LoRA: the reference is the policy itself with its adapter switched off (_fixed_logprobs); no second copy.
        with self.backend.loading():
            self.reference = None if cfg.algo.kl_coef == 0 else (
                self.policy if lora.is_lora(self.policy) else self._load(cfg.model.name_or_path, dtype))
        check_packing(self.policy, cfg.model)
        self.packed = packs(self.policy, cfg.model)
        if self.reference is not None and self.reference is not self.policy:
            self.reference.model.eval().requires_grad_(False)
        model = self.policy.model
        if cfg.train.freeze_vision:
            self._vision_tower().requires_grad_(False)
        if cfg.train.gradient_checkpointing:
            kwargs = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:  # transformers 5.19
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        self.backend.prepare(model, self._optimizer_settings())
        if self.reference is not None and self.reference is not self.policy:  # ZeRO-3: partitioned too
            self.reference.model = self.backend.partition_reference(self.reference.model)
        self.engine = build_engine(cfg.rollout.engine, self.policy, EngineSettings.from_config(cfg), self.backend.autocast,
                                   weights=self.backend.full_weights)
        self.producer = RolloutProducer(self.engine, self.task, self.dataset, self.stream,
                                        ProducerSettings.from_config(cfg, self.per_rank, self.dist.rank),
                                        comm_device=self.backend.comm_device)
        # the algorithm's functions with their hyper-parameters bound once
        self.objective = Objective(cfg.algo, cfg.rollout.max_new_tokens, self.policy.eos_token_ids)
        self._spare: list[Group] = []  # a group of the last rollout: DeepSpeed's padding on a rank without groups
        self.pipeline: AsyncRollout | None = None  # rollout.max_staleness > 0: sampling ahead (started by train())
        self._overlap: dict[str, float] = {}  # the pipeline's wait timings of the current step
        if checkpoint is not None:
            self._resume(checkpoint)
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            # provenance: written when the run starts from step 0 (over the config of an attempt that never
            # checkpointed), never rewritten by a resume
            if checkpoint is None or not (self.run_dir / "config.yaml").exists():
                save_config(self.resolved, self.run_dir, "train")
        distributed.barrier()
        self.stopper = GracefulStop(lambda: self.state.step + 1, announce=self.dist.is_main)
        self.memory = PeakMemory(self.device)  # memory/<phase>_rss_mib (+ _cuda_*) in every step's metrics
        self.runlog: RunLog | None = None

    # ---- set-up helpers -------------------------------------------------------------------------------------------

    def _check_layout(self) -> None:
        from mmgpg.config.checks import check_training
        from mmgpg.typed import ConfigError

        if problems := check_training(self.cfg, self.dist.world_size):
            raise ConfigError(problems)

    def _vision_tower(self) -> torch.nn.Module:
        """The policy's vision tower (train.freeze_vision); a config error for a text-only model, which has none."""
        from mmgpg.typed import ConfigError, Problem

        tower = self.policy.vision_tower
        if tower is None:
            raise ConfigError([Problem("train.freeze_vision", True, f"The {self.policy.family} model is text-only: it "
                                       "has no vision tower to freeze.", "remove train.freeze_vision=true (it applies "
                                       "to vision-language models).")])
        return tower

    def _optimizer_settings(self) -> OptimizerSettings:
        t = self.cfg.train
        # The schedule has max_steps x updates_per_batch slots; a skipped step advances it too.
        return OptimizerSettings(t.learning_rate, t.weight_decay, tuple(t.adam_betas), t.adam_eps, t.max_grad_norm,
                                 t.lr_scheduler, t.warmup_steps, total_steps=t.max_steps * self.cfg.algo.updates_per_batch,
                                 min_lr_rate=t.min_lr_rate)

    def _load(self, source: str, dtype: str) -> Policy:
        return load_policy_for(self.cfg.model, self.device, source=source, dtype=dtype)

    def _resume(self, checkpoint: Path) -> None:
        counters = resume.restore_run_state(checkpoint, self.run_dir, self.cfg, self.backend, self.stream,
                                            self._optimizer_settings, command="train", is_main=self.dist.is_main)
        self.state = StepState(**counters)

    # ---- phase 1: rollout -----------------------------------------------------------------------------------------

    def rollout(self) -> Collected:
        """The step's update from :meth:`mmgpg.rollout.producer.RolloutProducer.next_batch` (sampled until the valid
        fraction reaches β_th or the attempt cap) by the current weights; with ``rollout.max_staleness`` > 0, the pipeline's."""
        if self.pipeline is not None:
            collected, self._overlap = self.pipeline.take(self.state.step)
        else:
            with self.backend.generation_context():  # ZeRO-3: the weights gathered once for the whole rollout
                collected = self.producer.next_batch(self.state.step, policy_version=self.state.step)
        self._spare = collected.generated[:1]
        return collected

    def start_pipeline(self) -> None:
        """``rollout.max_staleness`` > 0: start sampling ahead from the current step (collective: the β_th sums of
        the sampling thread get a process group of their own)."""
        k = self.cfg.rollout.max_staleness
        if k == 0 or self.pipeline is not None:
            return
        self.pipeline = AsyncRollout.for_run(self.producer, staleness=k, start=self.state.step,
                                             last=self.cfg.train.max_steps, distributed_run=self.dist.enabled)
        if self.state.step > 0 and self.runlog is not None:
            self.runlog.note(f"resumed at step {self.state.step} with rollout.max_staleness={k}: the batches of steps "
                             f"{self.state.step + 1}-{self.state.step + k}, in flight when the checkpoint was written, "
                             "are sampled again from the same prompts, with the checkpoint's weights")
        self.pipeline.start()

    def _sync_engine(self) -> float:
        """Hand the engine the weights of version ``step + 1`` (every rank: collective). With the pipeline, the
        engine first finishes the batches of the previous version, on every rank, and then may start the next."""
        t0 = time.perf_counter()
        if self.pipeline is not None:  # the trainer waits too: counted in time/wait_rollout
            self._overlap["time/wait_rollout"] += self.pipeline.before_sync(self.state.step + 1)
            distributed.barrier()
        if self.engine.owns_weights:  # the backend gathers / merges; the engine moves them (every rank: collective)
            with self.memory.phase("sync"):
                self.engine.sync_weights(self.backend.full_weights(self.engine.weights_dtype))
        if self.pipeline is not None:
            self.pipeline.synced(self.state.step + 1)
        return time.perf_counter() - t0

    # ---- phase 2: advantages --------------------------------------------------------------------------------------

    def advantages(self, groups: list[Group]) -> StepCounts:
        """Advantages of the update's groups and the global counts B, M and tokens → α and the aggregation
        denominator (:meth:`mmgpg.train.objective.Objective.advantages`; collective)."""
        return self.objective.advantages(groups, self.backend.comm_device)

    # ---- phase 3: update ------------------------------------------------------------------------------------------

    def _collate(self, groups: list[Group]) -> CompletionBatch:
        return collate_groups(self.policy, self.task, groups, self.cfg.rollout.group_size)

    def _logprobs(self, policy: Policy, rollout: CompletionBatch) -> torch.Tensor:
        return group_logprobs(policy, rollout, self.cfg.model, self.cfg.rollout, self.backend.autocast)

    def _micro_batches(self, groups: list[Group]) -> list[tuple[CompletionBatch, torch.Tensor, float]]:
        """The trained groups (:meth:`Objective.trains`: zero-variance ones only when a KL term or a batch-whitened
        advantage needs them) as micro-batches of ``train.micro_batch_prompts`` prompt groups, each with its
        advantages ``[rows]`` and its weight (1); groups of similar length share one (:func:`length_ordered`).

        With collectives inside forward/backward (``backend.equal_micro_batches``: DeepSpeed), a rank with fewer
        micro-batches than the busiest one appends copies of one of its groups with weight 0 (they add exactly 0)."""
        chunks = plan_micro_batches(self.objective.trains(groups), self.cfg.train.micro_batch_prompts)
        micro = [(self._collate(c), torch.tensor([x for g in c for x in g.advantages], dtype=torch.float32), 1.0)
                 for c in chunks]
        most = distributed.all_max(len(micro), self.backend.comm_device) if self.backend.equal_micro_batches else 0
        spare = groups[:1] or self._spare  # drop_zero_variance: a rank may hold no group at all
        pad = (self._collate(spare), torch.zeros(self.cfg.rollout.group_size), 0.0) if most > len(micro) else None
        return micro + [pad] * (int(most) - len(micro)) if pad else micro

    def padding_positions(self, micro) -> tuple[int, int]:
        """(computed, padded) token positions of this rank's forwards over ``micro`` (:meth:`_micro_batches`), for
        ``update/padding_fraction``; DeepSpeed's weight-0 filler micro-batches are not counted."""
        computed, padded = zip((0, 0), *(padding_counts(r, packed=self.packed) for r, _, weight in micro if weight))
        return sum(computed), sum(padded)

    def _backward(self, micro, counts: StepCounts, old, ref, diff: LogprobDiff | None = None,
                  correction: list[tuple[float, ...]] | None = None) -> tuple[float, float]:
        """Backward of this rank's micro-batches (loss = (α · Σ w · policy + kl_coef · Σ KL) / global denominator,
        w: ``algo.rollout_correction``'s weights, 1 without), then the gradients summed over ranks. Returns this
        rank's (policy, KL) loss parts. ``diff`` collects the post-sync check from these log-probs (the rollout's
        weights: called before the optimizer step); ``correction`` the weights' statistics of each micro-batch."""
        a = self.cfg.algo
        alpha = counts.alpha if counts.alpha is not None else 1.0  # B == M: the policy term is 0 anyway
        policy_total = kl_total = 0.0
        self.backend.begin_accumulation(len(micro))
        for (r, adv, weight), old_lp, ref_lp in zip(micro, old, ref):
            logp = self._logprobs(self.policy, r)
            if diff is not None and r.sampled_logprobs is not None:
                diff.add(r.sampled_logprobs, logp, r.completion_mask)
            adv = adv.to(logp.device)
            mask = self.objective.loss_mask(r).to(logp.device)  # the overlong filter clears truncated rows
            is_weights = None
            if self.objective.correction is not None:  # π_prox: the old log-probs, else these (the same weights)
                is_weights, stats = self.objective.rollout_weights(r, old_lp if old_lp is not None else logp.detach(),
                                                                   mask, engine=self.engine.name, step=self.state.step)
                if correction is not None and weight:
                    correction.append(stats)
            loss = alpha * self.objective.policy_loss_sum(logp, adv, old_lp, mask, is_weights) / counts.denominator
            policy_total += float(loss.detach())
            if ref_lp is not None:
                kl_term = a.kl_coef * algorithms.token_loss_sum(algorithms.KL_ESTIMATORS[a.kl_estimator](logp, ref_lp),
                                                                mask, a.aggregation) / counts.denominator
                loss = loss + kl_term
                kl_total += float(kl_term.detach())
            self.backend.backward(loss * weight if weight != 1.0 else loss)
        self.backend.reduce_gradients()
        return policy_total, kl_total

    def _fixed_logprobs(self, micro) -> tuple[list, list]:
        """Old log-probs (only when updates_per_batch > 1: otherwise the ratio is exactly 1) and reference ones."""
        n = len(micro)
        old, ref = [None] * n, [None] * n
        with torch.no_grad():
            if self.cfg.algo.updates_per_batch > 1:
                old = [self._logprobs(self.policy, r) for r, _, _ in micro]
            if self.reference is not None:
                with lora.adapter_disabled(self.reference):  # LoRA: the base model inside the policy
                    ref = [self._logprobs(self.reference, r) for r, _, _ in micro]
        return old, ref

    def compute_gradients(self, groups: list[Group], counts: StepCounts) -> tuple[float, float]:
        """The step's exact gradient, summed over ranks, left in ``p.grad`` without clipping or stepping (the first
        of ``updates_per_batch`` iterations). For tests and diagnostics; :meth:`update` is the training path."""
        micro = self._micro_batches(groups)
        self.policy.model.train()
        try:
            return self._backward(micro, counts, *self._fixed_logprobs(micro))
        finally:
            self.policy.model.eval()

    def _optimizer_step(self) -> float:
        """The backend's step (skipped and counted when the gradient norm is NaN/Inf; the schedule advances either
        way); too many non-finite steps in a row stop training. Returns the global gradient norm before clipping."""
        t = self.cfg.train
        result = self.backend.step()
        if result.stepped:
            self.state.optimizer_steps += 1
            self.state.nonfinite_streak = 0
            return result.grad_norm
        self.state.nonfinite_steps += 1
        self.state.nonfinite_streak += 1
        if self.state.nonfinite_streak > t.max_nonfinite_steps:
            raise NonFiniteError(
                f"the gradient norm was {result.grad_norm} for {self.state.nonfinite_streak} consecutive optimizer "
                f"steps (step {self.state.step + 1}; train.max_nonfinite_steps={t.max_nonfinite_steps}): training "
                "diverged or overflowed. Lower train.learning_rate, check algo.std_eps, use model.dtype=float32, "
                "or resume from an earlier checkpoint.")
        return result.grad_norm

    def _checked(self, diff: LogprobDiff, groups: list[Group] | None = None) -> dict[str, float]:
        """The post-sync check over all ranks (collective): metrics, or a stop before the optimizer step. ``groups``:
        a step without update (no informative group) scores them in one no-grad forward for it."""
        limits = self.engine.check_limits
        if limits is None:  # rollout.logprob_check=false, or an engine that samples with the policy itself
            return {}
        with torch.no_grad():
            for r in [self._collate(groups[i : i + 1]) for i in range(len(groups or []))]:
                if r.sampled_logprobs is not None:
                    diff.add(r.sampled_logprobs, self._logprobs(self.policy, r), r.completion_mask)
        return check_logprob_diff(*diff.reduce(self.backend.comm_device), mean_limit=limits.mean,
                                  max_limit=limits.max, step=self.state.step)

    def update(self, groups: list[Group], counts: StepCounts) -> dict[str, float]:
        """Backward over this rank's forwarded groups, sum gradients over ranks, clip, step, sync the engine."""
        a = self.cfg.algo
        self.engine.sleep()  # rollout.vllm_sleep: free the engine's GPU memory during the update
        # the post-sync check compares the engine's log-probs with the trainer's at the same weights: not on samples
        # of older weights (rollout.max_staleness > 0; the ranks agree: a batch's version is the same on all)
        fresh = all(g.policy_version == self.state.step for g in groups)
        if counts.skip:
            self.state.skipped_steps += 1
            for _ in range(a.updates_per_batch):
                self.backend.advance_schedule()
            checked = self._checked(LogprobDiff(), groups) if fresh else {}
            if self.pipeline is not None:  # the weights did not change: the next version is this one
                self.pipeline.synced(self.state.step + 1)
            return {"loss/policy": 0.0, "loss/kl": 0.0, "grad_norm": 0.0, **checked}
        micro = self._micro_batches(groups)
        old, ref = self._fixed_logprobs(micro)
        self.policy.model.train()
        policy_total = kl_total = grad_norm = 0.0
        checked: dict[str, float] = {}
        correction: list[tuple[float, ...]] = []
        for i in range(a.updates_per_batch):
            diff = LogprobDiff() if i == 0 and fresh else None
            policy_total, kl_total = self._backward(micro, counts, old, ref, diff, correction if i == 0 else None)
            if diff is not None:
                checked = self._checked(diff)
            if i == 0 and self.objective.correction is not None:
                checked.update(rollout_correction.step_metrics(correction, self.backend.comm_device))
            grad_norm = self._optimizer_step()
        sync_s = self._sync_engine()
        self.policy.model.eval()
        policy_total, kl_total, computed, padding = distributed.all_sum(
            [policy_total, kl_total, *self.padding_positions(micro)], self.backend.comm_device)
        return {"loss/policy": policy_total, "loss/kl": kl_total, "grad_norm": grad_norm, "time/sync": sync_s,
                "update/padding_fraction": padding / max(computed, 1.0), **checked}

    # ---- one step -------------------------------------------------------------------------------------------------

    def train_step(self) -> dict[str, Any]:
        timings: dict[str, float] = {}
        t_step = t0 = time.perf_counter()
        with self.memory.phase("rollout"):
            collected = self.rollout()
        timings["time/rollout"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        counts = self.advantages(collected.update)
        timings["time/advantages"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with self.memory.phase("update"):
            update_stats = self.update(collected.update, counts)
        timings["time/update"] = time.perf_counter() - t0
        self.state.step += 1
        timings["time/step"] = time.perf_counter() - t_step
        if self.pipeline is not None:  # the overlap's waits and the update's staleness
            timings.update(**self._overlap, **staleness_metrics(collected.update, self.state.step - 1,
                                                                self.backend.comm_device))
        metrics = self._metrics(collected, counts, update_stats, timings)
        self._write_success_records(collected.generated)
        return metrics

    def _metrics(self, collected: Collected, counts: StepCounts, update_stats, timings) -> dict[str, Any]:
        generated, G, eos = collected.generated, self.cfg.rollout.group_size, set(self.policy.eos_token_ids)
        names = sorted(generated[0].components) if generated else []
        summed = distributed.sum_counts({
            "completions": len(generated) * G, "reward": sum(sum(g.rewards) for g in generated),
            "tokens": sum(g.num_tokens for g in generated),
            "truncated": sum(sum(g.truncated(eos)) for g in generated),
            **{f"reward/{name}": sum(sum(g.components[name]) for g in generated) for name in names},
            **group_episode_sums(generated, self.task.tools)}, self.backend.comm_device)
        n = max(summed["completions"], 1.0)
        metrics: dict[str, Any] = {"step": self.state.step, "reward/total": summed["reward"] / n}
        metrics.update({f"reward/{name}": summed[f"reward/{name}"] / n for name in names}, **episode_means(summed))
        metrics.update({
            "gpg/alpha": counts.alpha, "gpg/valid_fraction": counts.valid_fraction,
            "gpg/skipped_steps": self.state.skipped_steps, "gpg/num_samples": counts.num_samples,
            "gpg/num_zero_variance": counts.num_zero_variance, "train/nonfinite_steps": self.state.nonfinite_steps,
            "rollout/completion_tokens": summed["tokens"] / n, "rollout/truncated_fraction": summed["truncated"] / n,
            **collected.metrics(), **update_stats, "lr": self.backend.learning_rate(), **timings,
            "throughput/completion_tokens_per_s": summed["tokens"] / max(timings["time/step"], 1e-9),
            **distributed.max_counts(self.memory.last, self.backend.comm_device),  # the largest rank's peak
        })
        return metrics

    # ---- logging --------------------------------------------------------------------------------------------------

    def _log(self, metrics: dict[str, Any]) -> None:
        if getattr(self.dataset, "skipped", None):  # data.on_bad_row=skip: rows rank 0 skipped so far
            metrics["data/skipped_rows"] = len(self.dataset.skipped)
        self.runlog.log(metrics)

    def _write_success_records(self, generated: list[Group]) -> None:
        """One record per generated group (every rank, every attempt) in prompt_success.jsonl: whether it entered
        the update, its attempt, its rewards and the task's binary success per completion (null when the task
        declares no success)."""
        records = [SuccessRecord(step=self.state.step, prompt_id=g.example.id, attempt=g.attempt, rank=self.dist.rank,
                                 group_size=len(g.rewards), in_update=g.in_update, zero_variance=g.zero_variance,
                                 rewards=list(g.rewards), success=None if g.success is None else [int(x) for x in g.success])
                   for g in generated]
        everyone = distributed.gather_objects(records)
        if self.dist.is_main:
            rundir.append_records(self.run_dir / rundir.SUCCESS, [rec for recs in everyone for rec in recs])

    def evaluate(self) -> dict[str, float]:  # train.eval_every (mmgpg.train.live)
        return live.evaluate(self)

    def probe(self) -> None:  # train.probe_every
        live.probe(self)

    def save(self) -> Path:
        # sampling ahead: the stream position from before the first batch not yet trained (a resume samples the
        # batches in flight again)
        stream = self.pipeline.cursor(self.state.step) if self.pipeline is not None else self.stream
        return resume.save_run_state(self.run_dir, self.state.step, self.policy, self.backend, stream,
                                     vars(self.state).copy(), self.cfg, self.cfg.train.keep_last)

    # ---- the loop -------------------------------------------------------------------------------------------------

    def train(self) -> Path:
        """Run until ``train.max_steps``; save at ``save_every``, at the end, and at a SIGTERM/SIGINT step boundary."""
        cfg = self.cfg
        self.runlog = RunLog(self.run_dir, cfg, start_step=self.state.step, is_main=self.dist.is_main)
        planned = planned_memory(cfg, self.device, self.dist.world_size, self.runlog.note, (self.task, self.dataset))
        self.stopper.__enter__()
        try:
            if cfg.train.eval_every and self.state.step == 0:
                self._log({"step": 0, **self.evaluate()})
            if cfg.train.probe_every and self.state.step == 0:
                self.probe()
            self.start_pipeline()
            while self.state.step < cfg.train.max_steps:
                metrics = self.train_step()
                metrics.update(planned)
                planned = {}
                if cfg.train.eval_every and (self.state.step % cfg.train.eval_every == 0
                                             or self.state.step == cfg.train.max_steps):
                    metrics.update(self.evaluate())
                self._log(metrics)
                if cfg.train.probe_every and self.state.step % cfg.train.probe_every == 0:
                    self.probe()
                last = self.state.step >= cfg.train.max_steps
                stop = distributed.all_max(float(self.stopper.requested), self.backend.comm_device) > 0
                if last or stop or (cfg.train.save_every and self.state.step % cfg.train.save_every == 0):
                    self.save()
                if stop:
                    self.runlog.note(f"stopped by signal at step {self.state.step}; checkpoint saved")
                    break
        finally:
            if self.pipeline is not None:
                self.pipeline.close()
            self.runlog.close()
            self.stopper.__exit__()
            if self.lock is not None:
                self.lock.release()
        return self.run_dir
