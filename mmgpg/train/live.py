"""What a training run measures of its live policy between steps: the evaluation (``train.eval_every``) and the
per-prompt success probes (``train.probe_every``). Each takes the :class:`~mmgpg.train.trainer.Trainer` (``trainer``) and
leaves the training RNG stream untouched."""

from __future__ import annotations

import torch

from mmgpg import distributed, rundir
from mmgpg.task import first_items


def evaluate(trainer) -> dict[str, float]:
    """Greedy evaluation on ``train.eval_split``, its batches split over the ranks (every rank gets the
    numbers); a bad row of the split stops training or, under ``data.on_bad_row=skip``, is left out (as in
    ``mmgpg eval``). The sampled part (``train.eval_samples``) runs on rank 0."""
    from mmgpg.evaluation.run import run_evaluation, sampled_scores

    metrics = None
    t, r = trainer.cfg.train, trainer.cfg.rollout
    with trainer.backend.generation_context():  # every rank enters (ZeRO-3 gathers the weights once)
        # Evaluation must not move the training RNG stream (resume exactness): sample under a forked RNG.
        with torch.random.fork_rng(devices=[trainer.device] if trainer.device.type == "cuda" else []):
            report = run_evaluation(trainer.engine, trainer.task, t.eval_split, limit=t.eval_limit,
                                    max_new_tokens=r.max_new_tokens, on_bad_row=trainer.cfg.data.on_bad_row,
                                    checkpoint="live", engine_name=r.engine)  # collective: every rank decodes
            if trainer.dist.is_main:
                metrics = {f"eval/{k}": v for k, v in report.metrics.items()}
                if t.eval_samples:
                    torch.manual_seed(trainer.cfg.seed + 10_000 + trainer.state.step)
                    sampled = sampled_scores(trainer.engine, trainer.task, report.examples, samples=t.eval_samples,
                                             temperature=r.temperature, max_new_tokens=r.max_new_tokens)
                    metrics.update({f"eval/sampled_{k}": v for k, v in sampled.items()})
    return distributed.broadcast_object(metrics)


def probe(trainer) -> None:
    """``train.probe_every``: per-prompt success of the current policy on the first ``train.probe_limit``
    training prompts (rank 0; under a forked RNG so the training stream is untouched) → probe_success.jsonl."""
    from mmgpg.theory.probe import check_success, probe_prompts

    with trainer.backend.generation_context():  # every rank enters (ZeRO-3 gathers the weights once), rank 0 works
        if trainer.dist.is_main:
            t = trainer.cfg.train
            check_success(trainer.task, None)
            examples = first_items(trainer.dataset, t.probe_limit)
            with torch.random.fork_rng(devices=[trainer.device] if trainer.device.type == "cuda" else []):
                torch.manual_seed(trainer.cfg.seed + 20_000 + trainer.state.step)
                records = probe_prompts(trainer.engine, trainer.task, examples, trainer.cfg.rollout, step=trainer.state.step,
                                        checkpoint="live", split=t.split, samples=t.probe_samples,
                                        success_threshold=None)
            rundir.replace_probe(trainer.run_dir / rundir.PROBES, records)
    distributed.barrier()
