"""Supervised fine-tuning on a task's gold completions: the papers' "+SFT" baseline and the CPU demo's warm start.

It uses the same task plugins and the same policy code as RL (a vision-language or a text policy): the prompt goes
through the policy's ``encode_prompts``, and the loss is the mean negative log-likelihood of the gold completion tokens
(the task's ``gold_completion(example)`` followed by the first EOS id, ``<|im_end|>`` for Qwen), computed by its
``completion_logprobs``. That is the scorer RL uses, so the two cannot drift apart.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from mmgpg.backends import OptimizerSettings, build_backend
from mmgpg.config import Resolved, save_config
from mmgpg.evaluation.run import run_evaluation
from mmgpg.models import Policy, lora
from mmgpg.models.batch import CompletionBatch
from mmgpg.models.load import load_for_training
from mmgpg.models.logprobs import pad_completions
from mmgpg.models.save import save_policy
from mmgpg.rollout import EngineSettings, build_engine
from mmgpg.rollout.stream import PromptStream

# torch.optim.AdamW's default weight decay, which mmgpg sft has always used (its demo numbers depend on it).
from mmgpg.rundir import complete_checkpoints, run_dir_path
from mmgpg.task import Example, SkipBadRows, Task, check_task_for_model
from mmgpg.train import resume
from mmgpg.train.checkpoint import save_model_dir
from mmgpg.train.runlog import RunLog
from mmgpg.utils import GracefulStop, seed_everything


def gold_rollout(policy: Policy, task: Task, examples: list[Example]) -> CompletionBatch:
    """The examples' prompts with their gold completions as a one-completion-per-prompt :class:`CompletionBatch`."""
    if not task.overrides("gold_completion"):
        raise TypeError(f"task {task.name!r} has no gold_completion(example) -> str, so it cannot be used for SFT")
    gold = task.gold_completion
    if task.tools:  # gold episodes: the policy's turns, the task's tools run between them
        from mmgpg.rollout.episode import episode_prompt, scripted_episodes

        turns = [gold(ex) for ex in examples]
        return scripted_episodes(policy, task, [episode_prompt(task, ex) for ex in examples],
                                 [[t] if isinstance(t, str) else list(t) for t in turns])
    batch = policy.encode_prompts([task.prompt(ex) for ex in examples])
    tok = policy.tokenizer
    end = policy.eos_token_ids[0]
    ids, mask = pad_completions([tok(gold(ex), add_special_tokens=False)["input_ids"] + [end] for ex in examples],
                                policy.pad_token_id)
    return CompletionBatch(batch, 1, ids, mask)


class SFTTrainer:
    """Single-process SFT (``mmgpg sft``) on the training backend (``train.backend``); writes metrics.jsonl,
    config.yaml, checkpoints (``sft.save_every``, at the end and on SIGTERM/SIGINT; ``train.resume=true`` continues
    exactly, as for ``mmgpg train``) and ``final/`` (a Hugging Face dir)."""

    def __init__(self, resolved: Resolved, run_dir: str | Path | None = None):
        self.resolved, self.cfg = resolved, resolved.config
        cfg = self.cfg
        self.backend = build_backend(cfg.train.backend, cfg)
        if self.backend.dist.enabled:
            raise ValueError("mmgpg sft runs in a single process; start it without torchrun")
        self.run_dir = Path(run_dir) if run_dir else run_dir_path(cfg.output_dir, "sft")
        self.lock = resume.lock_run(self.run_dir, "sft", is_main=True)  # released at the end of train()
        checkpoint = resume.start_or_resume(self.run_dir, cfg.train.resume)
        if checkpoint is not None:  # a config the checkpoint cannot continue with is refused before loading anything
            resume.check_config(cfg, checkpoint, self.run_dir, record=False, command="sft")
        self.step = 0
        seed_everything(cfg.seed)
        with self.backend.loading():  # ZeRO-3: built partitioned, never whole on one rank
            self.policy = load_for_training(cfg.model, self.backend.device, self.backend.weights_dtype(cfg.model.dtype),
                                            checkpoint)
        self.task = resolved.build_task()
        check_task_for_model(self.task, self.policy.spec)  # e.g. a grounding task's box convention
        self.dataset = SkipBadRows(self.task.load(cfg.train.split), cfg.data.on_bad_row)
        self.stream = PromptStream(len(self.dataset), cfg.seed)
        self.backend.prepare(self.policy.model, self._optimizer_settings())
        self.engine = build_engine(cfg.rollout.engine, self.policy, EngineSettings.from_config(cfg), self.backend.autocast,
                                   weights=self.backend.full_weights)
        if checkpoint is not None:
            counters = resume.restore_run_state(checkpoint, self.run_dir, cfg, self.backend, self.stream,
                                                self._optimizer_settings, command="sft", is_main=True)
            self.step = int(counters["step"])
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not (checkpoint is not None and (self.run_dir / "config.yaml").exists()):  # provenance is never rewritten
            save_config(resolved, self.run_dir, "sft")
        self.stopper = GracefulStop(lambda: self.step + 1)

    def _optimizer_settings(self) -> OptimizerSettings:
        s = self.cfg.sft
        return OptimizerSettings(s.learning_rate, weight_decay=s.weight_decay, max_grad_norm=s.max_grad_norm,
                                 total_steps=s.max_steps)

    def evaluate(self) -> dict[str, float]:
        """Greedy evaluation on ``train.eval_split`` (its first ``train.eval_limit`` items under ``data.on_bad_row``)."""
        cfg = self.cfg
        if self.engine.owns_weights:  # an engine with its own copy (vLLM) evaluates the current weights
            self.engine.sync_weights(self.backend.full_weights(self.engine.weights_dtype))
        with self.backend.generation_context():  # ZeRO-3: the weights gathered once, not per token
            report = run_evaluation(self.engine, self.task, cfg.train.eval_split, limit=cfg.train.eval_limit,
                                    max_new_tokens=cfg.rollout.max_new_tokens, on_bad_row=cfg.data.on_bad_row,
                                    checkpoint="live", engine_name=cfg.rollout.engine)
        return {f"eval/{k}": v for k, v in report.metrics.items()}

    def save(self) -> Path:
        return resume.save_run_state(self.run_dir, self.step, self.policy, self.backend, self.stream,
                                     {"step": self.step}, self.cfg, self.cfg.train.keep_last)

    def train_step(self) -> dict:
        cfg = self.cfg
        t0 = time.perf_counter()
        examples = [self.dataset[i] for i in self.stream.next(cfg.sft.batch_size)]
        batch = gold_rollout(self.policy, self.task, examples)
        model = self.policy.model
        model.train()
        with self.backend.autocast():
            logp = self.policy.completion_logprobs(batch, chunk_size=cfg.model.logprob_chunk_size)
        loss = -(logp * batch.completion_mask).sum() / batch.completion_mask.sum()
        self.backend.begin_accumulation(1)
        self.backend.backward(loss)
        self.backend.reduce_gradients()
        grad_norm = self.backend.step().grad_norm
        model.eval()
        self.step += 1
        return {"step": self.step, "loss/sft": float(loss.detach()), "grad_norm": grad_norm,
                "time/step": time.perf_counter() - t0}

    def train(self, progress=None) -> Path:
        """Run to ``sft.max_steps`` (or stop at a step boundary with a checkpoint on SIGTERM/SIGINT); return the
        ``final/`` model directory, or the stopping checkpoint's ``policy/`` when stopped early. The run directory's
        lock is released at the end."""
        try:
            return self._train(progress)
        finally:
            self.lock.release()

    def _train(self, progress) -> Path:
        s = self.cfg.sft
        runlog = RunLog(self.run_dir, self.cfg, start_step=self.step, is_main=True, total_steps=s.max_steps,
                        tensorboard=False, use_wandb=False, progress=False)
        with self.stopper, contextlib.closing(runlog):
            while self.step < s.max_steps:
                metrics = self.train_step()
                if (s.eval_every and self.step % s.eval_every == 0) or self.step == s.max_steps:
                    metrics.update(self.evaluate())
                runlog.log(metrics)
                if progress is not None:
                    progress(metrics)
                last = self.step >= s.max_steps
                if last or self.stopper.requested or (s.save_every and self.step % s.save_every == 0):
                    saved = self.save()
                if self.stopper.requested and not last:
                    print(f"stopped by signal at step {self.step}; checkpoint saved (continue with "
                          "train.resume=true)", file=sys.stderr, flush=True)
                    return saved / "policy"
        # adapters merged, partitioned weights gathered: a plain Hugging Face model directory, written to a
        # temporary folder and renamed (a kill or a full disk never leaves a half-written final/)
        done = complete_checkpoints(self.run_dir)
        intact = (f"The last checkpoint, {done[-1]}, holds the same weights (its policy/ loads as a model)." if done
                  else "")
        full = self.backend.full_state_dict()
        final = save_model_dir(self.run_dir / "final", lambda d: save_policy(self.policy, d, full), intact=intact)
        if lora.is_lora(self.policy):
            adapter = self.backend.trainable_state_dict(self.policy.peft)  # collective under ZeRO-3
            save_model_dir(self.run_dir / "final_adapter", lambda d: lora.save_adapter(self.policy, d, adapter),
                           intact=intact)
        return final

