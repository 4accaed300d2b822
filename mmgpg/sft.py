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

import torch

from mmgpg.config import Resolved, save_config
from mmgpg.data import PromptStream
from mmgpg.evaluate import evaluate
from mmgpg.policy import Policy, Rollout, load_policy_for, pad_completions
from mmgpg.task import Example, build_task, first_items
from mmgpg.utils import make_run_dir, resolve_device, seed_everything


def gold_rollout(policy: Policy, task: Any, examples: list[Example]) -> Rollout:
    """The examples' prompts with their gold completions as a one-completion-per-prompt :class:`Rollout`."""
    gold = getattr(task, "gold_completion", None)
    if not callable(gold):
        raise TypeError(f"task {task.name!r} has no gold_completion(example) -> str, so it cannot be used for SFT")
    batch = policy.encode_prompts([task.prompt(ex) for ex in examples])
    tok = policy.processor.tokenizer
    end = policy.eos_token_ids[0]
    ids, mask = pad_completions([tok(gold(ex), add_special_tokens=False)["input_ids"] + [end] for ex in examples],
                                policy.pad_token_id)
    return Rollout(batch, 1, ids, mask)


class SFTTrainer:
    """Single-process SFT (``mmgpg sft``); writes metrics.jsonl, config.yaml and ``final/`` (a Hugging Face dir)."""

    def __init__(self, resolved: Resolved, run_dir: str | Path | None = None):
        self.resolved, self.cfg = resolved, resolved.config
        cfg = self.cfg
        self.run_dir = Path(run_dir) if run_dir else make_run_dir(cfg.output_dir, "sft")
        if (self.run_dir / "metrics.jsonl").exists():
            raise FileExistsError(f"{self.run_dir} already holds a run (metrics.jsonl); choose another output_dir")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(resolved, self.run_dir, "sft")
        seed_everything(cfg.seed)
        self.policy = load_policy_for(cfg.model, resolve_device(cfg.device))
        self.task = build_task(cfg.task.name, cfg.task.options)
        self.dataset = self.task.load(cfg.train.split)
        self.eval_examples = first_items(self.task.load(cfg.train.eval_split), cfg.train.eval_limit)
        self.stream = PromptStream(len(self.dataset), cfg.seed)
        self.optimizer = torch.optim.AdamW([p for p in self.policy.model.parameters() if p.requires_grad],
                                           lr=cfg.sft.learning_rate)

    def evaluate(self) -> dict[str, float]:
        metrics, _ = evaluate(self.policy, self.task, self.eval_examples,
                              max_new_tokens=self.cfg.rollout.max_new_tokens)
        return {f"eval/{k}": v for k, v in metrics.items()}

    def train(self, progress=None) -> Path:
        cfg, s = self.cfg, self.cfg.sft
        model = self.policy.model
        params = [p for p in model.parameters() if p.requires_grad]
        for step in range(1, s.max_steps + 1):
            t0 = time.perf_counter()
            examples = [self.dataset[i] for i in self.stream.next(s.batch_size)]
            rollout = gold_rollout(self.policy, self.task, examples)
            model.train()
            logp = self.policy.completion_logprobs(rollout, chunk_size=cfg.model.logprob_chunk_size)
            loss = -(logp * rollout.completion_mask).sum() / rollout.completion_mask.sum()
            loss.backward()
            grad_norm = (float(torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm)) if s.max_grad_norm > 0
                         else 0.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
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
