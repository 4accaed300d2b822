"""Supervised fine-tuning on a task's gold completions: the papers' "+SFT" baseline and the CPU demo's warm start.

It uses the same task plugins and the same policy code as RL: the prompt goes through
:meth:`~mmgpg.policy.Policy.encode_prompts`, and the loss is the mean negative log-likelihood of the gold completion
tokens (the task's ``gold_completion(example)`` followed by ``<|im_end|>``), computed by
:meth:`~mmgpg.policy.Policy.completion_logprobs`. That is the scorer RL uses, so the two cannot drift apart.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from mmgpg.backends import OptimizerSettings, build_backend
from mmgpg.config import Resolved, save_config
from mmgpg.data import PromptStream
from mmgpg.evaluate import evaluate
from mmgpg.policy import CompletionBatch, Policy, load_policy_for, pad_completions
from mmgpg.rollout import build_engine
from mmgpg.task import Example, build_task, first_items
from mmgpg.utils import make_run_dir, seed_everything

# torch.optim.AdamW's default weight decay, which mmgpg sft has always used (its demo numbers depend on it).
SFT_WEIGHT_DECAY = 0.01


def gold_rollout(policy: Policy, task: Any, examples: list[Example]) -> CompletionBatch:
    """The examples' prompts with their gold completions as a one-completion-per-prompt :class:`CompletionBatch`."""
    gold = getattr(task, "gold_completion", None)
    if not callable(gold):
        raise TypeError(f"task {task.name!r} has no gold_completion(example) -> str, so it cannot be used for SFT")
    batch = policy.encode_prompts([task.prompt(ex) for ex in examples])
    tok = policy.processor.tokenizer
    end = policy.eos_token_ids[0]
    ids, mask = pad_completions([tok(gold(ex), add_special_tokens=False)["input_ids"] + [end] for ex in examples],
                                policy.pad_token_id)
    return CompletionBatch(batch, 1, ids, mask)


class SFTTrainer:
    """Single-process SFT (``mmgpg sft``) on the training backend (``train.backend``); writes metrics.jsonl,
    config.yaml and ``final/`` (a Hugging Face dir)."""

    def __init__(self, resolved: Resolved, run_dir: str | Path | None = None):
        self.resolved, self.cfg = resolved, resolved.config
        cfg = self.cfg
        self.backend = build_backend(cfg.train.backend, cfg)
        if self.backend.dist.enabled:
            raise ValueError("mmgpg sft runs in a single process; start it without torchrun")
        self.run_dir = Path(run_dir) if run_dir else make_run_dir(cfg.output_dir, "sft")
        if (self.run_dir / "metrics.jsonl").exists():
            raise FileExistsError(f"{self.run_dir} already holds a run (metrics.jsonl); choose another output_dir")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(resolved, self.run_dir, "sft")
        seed_everything(cfg.seed)
        self.policy = load_policy_for(cfg.model, self.backend.device,
                                      dtype=self.backend.weights_dtype(cfg.model.dtype))
        self.task = build_task(cfg.task.name, cfg.task.options)
        self.dataset = self.task.load(cfg.train.split)
        self.eval_examples = first_items(self.task.load(cfg.train.eval_split), cfg.train.eval_limit)
        self.stream = PromptStream(len(self.dataset), cfg.seed)
        self.backend.prepare(self.policy.model, OptimizerSettings(
            cfg.sft.learning_rate, weight_decay=SFT_WEIGHT_DECAY, max_grad_norm=cfg.sft.max_grad_norm,
            total_steps=cfg.sft.max_steps))
        self.engine = build_engine(cfg.rollout.engine, self.policy, cfg, self.backend.autocast)

    def evaluate(self) -> dict[str, float]:
        metrics, _ = evaluate(self.engine, self.task, self.eval_examples,
                              max_new_tokens=self.cfg.rollout.max_new_tokens)
        return {f"eval/{k}": v for k, v in metrics.items()}

    def train(self, progress=None) -> Path:
        cfg, s = self.cfg, self.cfg.sft
        model = self.policy.model
        for step in range(1, s.max_steps + 1):
            t0 = time.perf_counter()
            examples = [self.dataset[i] for i in self.stream.next(s.batch_size)]
            rollout = gold_rollout(self.policy, self.task, examples)
            model.train()
            with self.backend.autocast():
                logp = self.policy.completion_logprobs(rollout, chunk_size=cfg.model.logprob_chunk_size)
            loss = -(logp * rollout.completion_mask).sum() / rollout.completion_mask.sum()
            self.backend.backward(loss)
            self.backend.reduce_gradients()
            grad_norm = self.backend.step().grad_norm
            model.eval()
            metrics = {"step": step, "loss/sft": float(loss.detach()), "grad_norm": grad_norm,
                       "time/step": time.perf_counter() - t0}
            if (s.eval_every and step % s.eval_every == 0) or step == s.max_steps:
                metrics.update(self.evaluate())
            with open(self.run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(metrics) + "\n")
            if progress is not None:
                progress(metrics)
        final = self.run_dir / "final"
        model.save_pretrained(final)
        self.policy.processor.save_pretrained(final)
        return final
