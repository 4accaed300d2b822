"""Sampled evaluation (``mmgpg eval --samples K``): one judged record per sample, pass@k recomputed independently
from the written predictions (exact binomials), re-scoring a sampled predictions file, greedy as one sample at
temperature 0, seeding, several benchmarks with their average, a VL task, and the flags that are refused. The tiny
text model (``tiny:qwen2``) on :class:`support.fixture_tasks.TextParityCoin`, whose 0/1 ``correct`` a random model
earns about half the time, so the problems have some, all and no samples correct."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from support import FIXTURE_TASKS, run_mmgpg
from support.fixture_tasks import TextParityCoin

from mmgpg.cli import main
from mmgpg.evaluation.predictions import rescore_predictions, write_report
from mmgpg.evaluation.run import SampledDecoding, run_evaluation
from mmgpg.models.load import load_policy
from mmgpg.rollout.hf import HFEngine

COIN = f"{FIXTURE_TASKS}:TextParityCoin"
TEXT = ["model.name_or_path=tiny:qwen2", "model.dtype=float32"]


@pytest.fixture(scope="module")
def engine(tiny_text_dir):
    return HFEngine(load_policy(str(tiny_text_dir), dtype="float32", device="cpu"))


def _evaluate(engine, decoding=None, *, limit=6, batch_size=8, task=None):
    return run_evaluation(engine, task or TextParityCoin(), "test", limit=limit, max_new_tokens=6,
                          batch_size=batch_size, checkpoint="tiny", engine_name="hf", decoding=decoding)


def exact_pass_at_k(records, k):
    """The independent reference: the mean over problems of 1 - C(n-c, k) / C(n, k) in exact arithmetic."""
    groups: dict[str, list[float]] = {}
    for r in records:
        groups.setdefault(r["id"], []).append(r["correct"])
    terms = [1 - Fraction(math.comb(len(g) - int(sum(g)), k), math.comb(len(g), k)) for g in groups.values()]
    return float(sum(terms) / len(terms))


def test_one_record_per_sample_and_pass_at_k(engine):
    report = _evaluate(engine, SampledDecoding(4, 1.0, seed=3))
    recs = report.judged
    assert len(recs) == 24 and [r["sample"] for r in recs] == [0, 1, 2, 3] * 6
    assert [r["id"] for r in recs[::4]] == [f"text-parity-test-{i}" for i in range(6)]
    assert all(r["id"] == recs[4 * (i // 4)]["id"] for i, r in enumerate(recs))  # problem-major
    counts = {sum(r["correct"] for r in recs if r["id"] == i) for i in {r["id"] for r in recs}}
    assert len(counts) >= 3, f"the fixture must give problems with different numbers correct; got {counts}"
    m = report.metrics
    for k in (1, 2, 4):
        assert m[f"pass@{k}"] == pytest.approx(exact_pass_at_k(recs, k), abs=1e-12), k
    assert m["pass@1"] < m["pass@2"] < m["pass@4"] <= 1
    assert m["accuracy"] == pytest.approx(m["pass@1"])  # the task's aggregate over all 24 samples
    assert (m["num_problems"], m["samples_per_problem"], m["num_samples"]) == (6, 4, 24)
    assert report.counts == {"evaluated": 6, "skipped": 0, "available": 16, "parse_failures": 0, "samples": 24}
    assert report.source["decoding"] == "sampled" and report.source["top_p"] == 1.0 and report.source["seed"] == 3


def test_rescoring_the_predictions_reproduces_the_metrics(engine, tmp_path):
    report = _evaluate(engine, SampledDecoding(4, 1.0, top_p=0.95, seed=1))
    write_report(tmp_path, report, {})
    again = rescore_predictions(TextParityCoin(), tmp_path / "predictions.jsonl", "paper", split="test", limit=6)
    assert again.metrics == report.metrics and "pass@4" in again.metrics
    rows = [json.loads(x) for x in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    rows[5]["sample"] = 0  # problem 1's second sample as a copy of its first: refused with the lines
    (tmp_path / "dup.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"1 \(id, sample\) pair\(s\) appear more than once .*lines 5, 6"):
        rescore_predictions(TextParityCoin(), tmp_path / "dup.jsonl", "paper", split="test", limit=6)
    del rows[5]["sample"]  # a row without its index in a sampled file: skipped with the reason, pass@k over the rest
    (tmp_path / "missing.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    partial = rescore_predictions(TextParityCoin(), tmp_path / "missing.jsonl", "paper", split="test", limit=6)
    assert partial.counts["skipped"] == 1 and "sample is missing" in partial.records[5]["skipped"]
    assert partial.metrics["num_samples"] == 23 and "pass@4" not in partial.metrics  # problem 1 has 3 samples
    assert partial.metrics["pass@1"] == pytest.approx(exact_pass_at_k(partial.judged, 1))


def test_one_greedy_sample_is_greedy_decoding(engine):
    greedy, sampled = _evaluate(engine), _evaluate(engine, SampledDecoding(1, 0.0))
    assert [r["model_output"] for r in sampled.judged] == [r["model_output"] for r in greedy.judged]
    assert "sample" not in greedy.judged[0] and not any(k.startswith("pass@") for k in greedy.metrics)
    assert sampled.metrics["pass@1"] == pytest.approx(greedy.metrics["accuracy"])


def test_the_seed_decides_the_samples_and_the_callers_rng_is_left_alone(engine):
    state = torch.random.get_rng_state()
    a, b = (_evaluate(engine, SampledDecoding(4, 1.0, seed=5)) for _ in range(2))
    c = _evaluate(engine, SampledDecoding(4, 1.0, seed=6))
    assert torch.equal(torch.random.get_rng_state(), state)
    outputs = [[r["model_output"] for r in x.judged] for x in (a, b, c)]
    assert outputs[0] == outputs[1] and outputs[0] != outputs[2]
    assert len(set(outputs[0][:4])) > 1, "the samples of one problem must differ"


class RecordingEngine:
    """The HF engine, recording each generate call's group size and seed key."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, conversations, group_size, sampling):
        self.calls.append((len(conversations), group_size, sampling.seed_key, sampling.first_prompt))
        return self.engine.generate(conversations, group_size, sampling)


def test_more_samples_than_the_batch_come_in_pieces_with_their_own_seeds(engine):
    """K = 7 samples with --batch-size 3: each problem's samples in calls of 3, 3 and 1 sequences (never one call of
    K · problems), numbered 0..6, each piece with its own request seeds (an engine with per-request seeds would
    otherwise draw the same samples in every piece)."""
    recording = RecordingEngine(engine)
    report = run_evaluation(recording, TextParityCoin(), "test", limit=2, max_new_tokens=6, batch_size=3,
                            checkpoint="tiny", engine_name="hf", decoding=SampledDecoding(7, 1.0, seed=3))
    assert [(n, g) for n, g, _, _ in recording.calls] == [(1, 3), (1, 3), (1, 1)] * 2
    keys = [(key, first) for _, _, key, first in recording.calls]
    assert keys[:3] == [((3, keys[0][0][1], j), 0) for j in range(3)] and len(set(keys)) == 6
    recs = report.judged
    assert [r["sample"] for r in recs] == list(range(7)) * 2 and report.counts["samples"] == 14
    assert len({r["model_output"] for r in recs[:7]}) > 1


_cli = run_mmgpg


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_cli_two_benchmarks_their_average_and_rescoring(tmp_path):
    out = tmp_path / "two"
    proc = _cli("eval", "--task", f"{COIN},{FIXTURE_TASKS}:TextParity", "--ckpt", "tiny:qwen2", *TEXT, "--limit", "4",
                "--samples", "4", "--temperature", "1.0", "--batch-size", "8", "--max-new-tokens", "6", "--output",
                str(out))
    summary = _json(out / "metrics.json")
    coin, parity = (_json(out / name / "metrics.json") for name in ("text_parity_coin", "text_parity"))
    assert coin["samples"] == 4 and coin["temperature"] == 1.0 and coin["top_p"] == 0.95  # the authors' top_p
    per = {"text_parity_coin": coin["metrics"]["pass@1"], "text_parity": parity["metrics"]["pass@1"]}
    assert summary["metrics"] == pytest.approx({**{f"{k}/pass@1": v for k, v in per.items()},
                                                "average/pass@1": sum(per.values()) / 2})
    assert set(summary["benchmarks"]) == set(per) and "average/pass@1" in proc.stdout
    rows = [json.loads(x) for x in (out / "text_parity_coin" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and coin["metrics"]["pass@2"] == pytest.approx(exact_pass_at_k(rows, 2), abs=1e-12)
    _cli("eval", "--task", COIN, "--predictions", str(out / "text_parity_coin" / "predictions.jsonl"), "--output",
         str(tmp_path / "re"))
    assert _json(tmp_path / "re" / "metrics.json")["metrics"] == coin["metrics"]


def test_cli_sampled_evaluation_of_a_vision_language_task(tmp_path):
    _cli("eval", "--task", f"{FIXTURE_TASKS}:ParityShapes", "--ckpt", "tiny", "--limit", "3", "--samples", "2",
         "--batch-size", "6", "--max-new-tokens", "6", "--seed", "4", "--output", str(tmp_path))
    m = _json(tmp_path / "metrics.json")
    rows = [json.loads(x) for x in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and [r["sample"] for r in rows] == [0, 1] * 3 and m["seed"] == 4
    assert m["temperature"] == 0.6 and m["metrics"]["pass@2"] == pytest.approx(exact_pass_at_k(rows, 2), abs=1e-12)


@pytest.mark.parametrize(("args", "message"), [
    (["--temperature", "0.6"], "--temperature apply to sampled evaluation: add --samples K"),
    (["--samples", "0"], "--samples must be an integer >= 1"),
    (["--samples", "2", "--top-p", "0"], r"--top-p must be in \(0, 1\]"),
    (["--samples", "2", "--temperature", "0"], "temperature 0 is greedy decoding: the 2 samples"),
    (["--samples", "2", "--temperature", "-1"], "--temperature must be >= 0"),
])
def test_refused_flags(args, message, capsys):
    assert main(["eval", "--task", COIN, "--ckpt", "tiny:qwen2", *TEXT, *args]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err


def test_refused_combinations(tmp_path, capsys):
    pred = tmp_path / "p.jsonl"
    pred.write_text('{"id": "a", "model_output": "x", "ground_truth": "odd"}\n')
    assert main(["eval", "--task", COIN, "--predictions", str(pred), "--samples", "2"]) == 2
    assert "--predictions re-judges outputs already made" in capsys.readouterr().err
    assert main(["eval", "--task", f"{COIN},{COIN}", "--ckpt", "tiny:qwen2"]) == 2
    assert "more than once" in capsys.readouterr().err
    assert main(["eval", "--task", f"{COIN},shapes", "--predictions", str(pred)]) == 2
    assert "--predictions re-judges one task's outputs" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_vllm_training_top_p_rule_does_not_apply_to_evaluation(capsys):
    """Training refuses rollout.top_p < 1 with vLLM (its post-sync check would always fire); evaluation runs no such
    check, so with a training config's top_p the first refusal here (no vLLM installed) is the missing install."""
    assert main(["eval", "--task", COIN, "--ckpt", "tiny:qwen2", *TEXT, "--engine", "vllm", "rollout.top_p=0.9",
                 "--samples", "2", "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert "vLLM is not installed" in err and "rollout.top_p" not in err, err
