"""mmgpg diagnose and mmgpg probe: the analyses against hand-computed numbers, a synthetic run directory with known
per-prompt success probabilities, and a real short CPU run on the tiny model (train → probe → diagnose)."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
from support import FIXTURE_TASKS

from mmgpg.cli import main
from mmgpg.config import resolve, save_config
from mmgpg.rundir import read_config
from mmgpg.theory import diagnose as D

FIXTURES = FIXTURE_TASKS


def visit(step, pid, k, G=2, attempt=0, in_update=True):
    return D.Visit(step, pid, attempt, G, k, in_update, k in (0, G))


def test_valid_fraction_z_by_hand():
    # G = 2, p = 1/2: P(mixed) = 1 - 1/4 - 1/4 = 1/2. Four attempt-0 groups, three mixed: mean 2, var 4 * 1/4 = 1,
    # z = (3 - 2)/1 = 1. The attempt-1 group is not counted.
    visits = [visit(1, "a", 1), visit(1, "b", 2), visit(2, "a", 1), visit(2, "b", 1), visit(2, "c", 0, attempt=1)]
    out = D.valid_fraction_check(visits, [0.5] * 5)
    assert out["total_observed"] == 3 and out["total_predicted"] == pytest.approx(2.0)
    assert out["z_total"] == pytest.approx(1.0)
    # step 1: one of two mixed, mean 1, var 1/2 -> z = 0; step 2: two of two, z = (2 - 1)/sqrt(1/2) = 1.41421
    assert [s["z"] for s in out["steps"]] == pytest.approx([0.0, math.sqrt(2)])


def test_jeffreys_and_bins():
    mean, lo, hi = D.jeffreys(0, 10)
    assert mean == pytest.approx(0.5 / 11) and lo == 0.0 and mean < hi < 0.3
    mean, lo, hi = D.jeffreys(5, 10)
    assert mean == 0.5 and lo == pytest.approx(1 - hi)  # symmetric posterior
    assert [D.bin_label(p) for p in (0.0, 0.05, 0.1, 0.35, 0.95, 1.0)] == [
        "0", "(0, 0.1]", "(0, 0.1]", "(0.3, 0.5]", "(0.9, 1)", "1"]


def test_amplification_table_by_hand():
    cfg = resolve(["algo=grpo", "algo.kl_coef=0.5", "algo.kl_estimator=k2", "algo.advantage=group_mean",
                   "rollout.group_size=2"]).config
    p_ref = {"a": 0.2, "b": 0.25, "c": 0.0, "d": 0.6}
    final = {"a": (6, 10), "b": (1, 10), "c": (0, 10), "d": (0, 0)}  # d has no final estimate: left out
    rows = {r["bin"]: r for r in D.amplification_table(p_ref, final, cfg)}
    assert set(rows) == {"(0.1, 0.3]", "0"}
    r = rows["(0.1, 0.3]"]
    assert r["prompts"] == 2 and r["mean_p_ref"] == pytest.approx(0.225) and r["mean_final"] == pytest.approx(0.35)
    assert r["share_amplified"] == 0.5  # 0.6 > 0.2, 0.1 < 0.25
    # predicted (k2, Omega = 1/2, beta = 0.5): p* = sigma(logit p_ref + 1) -> e/4/(1 + e/4) and (e/3)/(1 + e/3)
    assert r["mean_predicted"] == pytest.approx(((math.e / 4) / (1 + math.e / 4) + (math.e / 3) / (1 + math.e / 3)) / 2)
    assert rows["0"]["mean_predicted"] == 0.0 and rows["0"]["share_amplified"] == 0.0


def test_read_visits_success_sources_and_errors(tmp_path):
    path = tmp_path / "prompt_success.jsonl"
    base = {"step": 1, "prompt_id": "x", "attempt": 0, "rank": 0, "group_size": 3, "in_update": True,
            "zero_variance": False, "rewards": [1.5, 0.2, 1.0]}
    path.write_text(json.dumps({**base, "success": [1, 0, 1], "successes": 2}) + "\n")
    assert D.read_visits(path)[0].successes == 2
    path.write_text(json.dumps({**base, "success": None, "successes": None}) + "\n")
    with pytest.raises(ValueError, match=r"prompt_success.jsonl:1: .*--success-threshold"):
        D.read_visits(path)
    assert D.read_visits(path, success_threshold=1.0)[0].successes == 2  # 1.5 and 1.0
    path.write_text(json.dumps({**base, "success": [1, 0]}) + "\n")
    with pytest.raises(ValueError, match="list of 3"):
        D.read_visits(path)
    path.write_text(json.dumps(base) + "\n{oops\n")
    with pytest.raises(ValueError, match=r":2: not valid JSON"):
        D.read_visits(path, success_threshold=1.0)


def test_drift_fit_recovers_c():
    """Per-step observed success generated exactly from the natural reading z = z_ref + c x_t, c = 40."""
    G, lr, c = 10**6, 1e-3, 40.0
    metrics = [{"step": s, "gpg/alpha": 1.0 + 0.1 * s, "lr": lr} for s in range(1, 9)]
    p_ref = {"a": 0.1, "b": 0.4}
    x, acc = {}, 0.0
    for m in metrics:
        x[m["step"]] = acc
        acc += m["gpg/alpha"] * lr * (1 - 1 / G)
    visits = []
    for s in x:
        for pid, p in p_ref.items():
            z = math.log(p / (1 - p)) + c * x[s]
            visits.append(visit(s, pid, round(G / (1 + math.exp(-z))), G=G))
    fit = D.drift_fit(visits, metrics, p_ref, G)
    assert fit["natural"]["c"] == pytest.approx(c, rel=1e-3)
    assert fit["natural"]["sse"] < fit["euclidean"]["sse"]


def test_drift_fit_skipped_steps_move_nothing():
    """A skipped step (no informative group: the trainer logs ``gpg/alpha: null`` and makes no update) adds nothing
    to x_t, and its rollout still counts as an observation at the x reached before it. Steps 1..8 with step 3 and 6
    skipped: the fit is exactly the fit of the same data with those steps' α set to 0."""
    G, lr, c = 10**6, 1e-3, 40.0
    alphas = {s: (None if s in (3, 6) else 1.0 + 0.1 * s) for s in range(1, 9)}
    metrics = [{"step": s, "gpg/alpha": a, "lr": lr} for s, a in alphas.items()]
    p_ref = {"a": 0.1, "b": 0.4}
    x, acc = {}, 0.0
    for s, a in alphas.items():
        x[s] = acc
        acc += (a or 0.0) * lr * (1 - 1 / G)
    visits = [visit(s, pid, round(G / (1 + math.exp(-(math.log(p / (1 - p)) + c * x[s])))), G=G)
              for s in x for pid, p in p_ref.items()]
    fit = D.drift_fit(visits, metrics, p_ref, G)
    assert fit["steps"] == list(range(1, 9))  # the skipped steps' rollouts are observations too
    assert fit["x_final"] == pytest.approx(acc)
    assert fit["natural"]["c"] == pytest.approx(c, rel=1e-3)


def test_diagnose_run_with_a_skipped_step(tmp_path, capsys):
    run = tmp_path / "run"
    write_synthetic_run(run, {"a": 0.5, "b": 0.3, "c": 0.7, "d": 0.5}, steps=6)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows[2]["gpg/alpha"] = None  # step 3 had no informative group
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["diagnose", str(run)]) == 0
    report = json.loads((run / "diagnose" / "diagnose.json").read_text())
    assert 3 in report["drift"]["steps"]


def write_synthetic_run(run: Path, p_true: dict[str, float], steps: int = 40, G: int = 4, seed: int = 0) -> None:
    save_config(resolve(["algo=gpg", f"rollout.group_size={G}", "train.prompts_per_step=4"]), run, "train")
    rng = random.Random(seed)
    ids = sorted(p_true)
    with open(run / "prompt_success.jsonl", "w") as f, open(run / "metrics.jsonl", "w") as m:
        for step in range(1, steps + 1):
            for pid in rng.sample(ids, 4):
                success = [int(rng.random() < p_true[pid]) for _ in range(G)]
                rec = {"step": step, "prompt_id": pid, "attempt": 0, "rank": 0, "group_size": G,
                       "in_update": 0 < sum(success) < G, "zero_variance": sum(success) in (0, G),
                       "rewards": [float(s) for s in success], "success": success, "successes": sum(success)}
                f.write(json.dumps(rec) + "\n")
            m.write(json.dumps({"step": step, "gpg/alpha": 1.0, "lr": 1e-6}) + "\n")
    with open(run / "probe_success.jsonl", "w") as f:
        for pid, p in p_true.items():  # a large probe: 10000 samples, counts at their expectation
            f.write(json.dumps({"step": 0, "prompt_id": pid, "split": "train", "samples": 10000,
                                "successes": round(10000 * p)}) + "\n")


def test_diagnose_synthetic_run_without_learning(tmp_path, capsys):
    """Prompts with fixed, known p: the observed mixed fraction agrees with 1 - P0(p) (|z| < 3), groups enter the
    update exactly when mixed, and nothing is amplified beyond noise."""
    run = tmp_path / "run"
    p_true = {f"q{i}": p for i, p in enumerate([0.0, 0.05, 0.2, 0.5, 0.8, 0.95, 1.0, 0.35])}
    write_synthetic_run(run, p_true)
    assert main(["diagnose", str(run)]) == 0
    text = capsys.readouterr().out
    assert "(a) attempt-0 groups" in text and "step-0 probe" in text
    report = json.loads((run / "diagnose" / "diagnose.json").read_text())
    assert abs(report["valid_fraction"]["z_total"]) < 3
    for row in report["selection"]:
        assert row["update_share"] == pytest.approx(row["observed_mixed"])
    # p = 0 and 0.05 share the (0, 0.1] bin (a 0/10000 probe is p ~ 5e-5 under Jeffreys): P(mixed) = (0 + 0.185)/2
    low = {r["bin"]: r for r in report["selection"]}["(0, 0.1]"]
    assert 0.05 < low["predicted_mixed"] < 0.15 and low["in_update"] <= 0.3 * low["drawn"]
    for name in ("valid_fraction.png", "trajectories.png", "amplification.png", "drift.png"):
        assert (run / "diagnose" / name).stat().st_size > 1000


def test_diagnose_errors(tmp_path, capsys):
    assert main(["diagnose", str(tmp_path)]) == 2
    assert "config.yaml does not exist" in capsys.readouterr().err
    run = tmp_path / "run"
    write_synthetic_run(run, {"a": 0.5, "b": 0.5, "c": 0.5, "d": 0.5}, steps=2)
    lines = (run / "prompt_success.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    bad["success"] = None
    (run / "prompt_success.jsonl").write_text("\n".join([lines[0], json.dumps(bad)]) + "\n")
    assert main(["diagnose", str(run)]) == 2
    assert "prompt_success.jsonl:2" in capsys.readouterr().err


@pytest.mark.parametrize(("field", "value", "message"), [
    ("success", ["no", "no", "no", "no"], "'success' must be a list of 4 values, each 0 or 1"),  # bool("no") is True
    ("success", [0.5, 1, 0, 1], "each 0 or 1"),
    ("success", [2, 1, 0, 1], "each 0 or 1"),
    ("group_size", 0, "'group_size' must be at least 1"),
])
def test_diagnose_refuses_success_records_it_would_misread(tmp_path, capsys, field, value, message):
    """A success list of strings used to count as all successes (rc 0, a silent wrong result): every bad record is
    an error naming the file, the line and the field, rc 2."""
    run = tmp_path / "run"
    write_synthetic_run(run, {"a": 0.5, "b": 0.5, "c": 0.5, "d": 0.5}, steps=2)
    lines = (run / "prompt_success.jsonl").read_text().splitlines()
    bad = {**json.loads(lines[2]), field: value}
    (run / "prompt_success.jsonl").write_text("\n".join([*lines[:2], json.dumps(bad), *lines[3:]]) + "\n")
    assert main(["diagnose", str(run)]) == 2
    err = capsys.readouterr().err
    assert "prompt_success.jsonl:3: " in err and message in err and "Traceback" not in err


@pytest.mark.parametrize(("record", "message"), [
    ({"samples": 0, "successes": 0}, "'samples' must be at least 1"),  # was a ZeroDivisionError
    ({"samples": 4, "successes": 5}, "successes must lie in [0, samples]; got 5 of 4"),
    ({"samples": "64", "successes": 3}, "'samples' must be int; got '64'"),
])
def test_diagnose_refuses_a_bad_probe_record(tmp_path, capsys, record, message):
    run = tmp_path / "run"
    write_synthetic_run(run, {"a": 0.5, "b": 0.5, "c": 0.5, "d": 0.5}, steps=2)
    with open(run / "probe_success.jsonl", "a") as f:
        f.write(json.dumps({"step": 0, "prompt_id": "a", "split": "train", **record}) + "\n")
    assert main(["diagnose", str(run)]) == 2
    err = capsys.readouterr().err
    assert "probe_success.jsonl:5: " in err and message in err and "Traceback" not in err


TINY = ["model=tiny", "rollout.group_size=4", "rollout.max_new_tokens=12", "train.prompts_per_step=4",
        "train.micro_batch_prompts=2", "train.learning_rate=1e-3", "train.progress=false", "train.tensorboard=false"]


@pytest.mark.slow
def test_train_probe_diagnose_on_a_real_cpu_run(tmp_path):
    run = tmp_path / "run"

    def cli(*args):
        proc = subprocess.run([sys.executable, "-m", "mmgpg", *args], capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    cli("train", f"task={FIXTURES}:ParityShapes", "task.num_train=6", *TINY, "train.max_steps=4", f"output_dir={run}")
    mine = f"task={FIXTURES}:ParityShapes"  # a task file is imported only when the user names it (docs/trust.md)
    cli("probe", str(run), mine, "--step", "0", "--samples", "8", "--success-threshold", "1")
    out = cli("probe", str(run), mine, "--samples", "8", "--success-threshold", "1")
    assert "at step 4" in out
    probes = [json.loads(x) for x in (run / "probe_success.jsonl").read_text().splitlines()]
    assert sorted({p["step"] for p in probes}) == [0, 4] and len(probes) == 12
    assert all(0 <= p["successes"] <= 8 and p["samples"] == 8 for p in probes)
    text = cli("diagnose", str(run), "--success-threshold", "1")
    assert "probe steps: [0, 4]" in text and "(c) amplification" in text
    report = json.loads((run / "diagnose" / "diagnose.json").read_text())
    assert report["sources"]["p_ref"] == "step-0 probe" and report["sources"]["final"] == "probe at step 4"
    assert sum(r["prompts"] for r in report["amplification"]) == 6


def test_probe_file_and_checkpoint_lookup(tmp_path):
    from mmgpg.rundir import ProbeRecord, replace_probe
    from mmgpg.theory.probe import locate

    run = tmp_path / "run"
    save_config(resolve(["algo=gpg", "rollout.temperature=0.7"]), run, "train")
    assert locate(str(run), 0) == (run, "", 0)  # step 0: the run's starting model
    assert locate(str(run), None) == (run, "", 0)  # no checkpoint yet
    with pytest.raises(FileNotFoundError, match="no complete checkpoint for step 5"):
        locate(str(run), 5)
    assert locate("tiny", None) == (None, "tiny", 0)
    cfg = read_config(run, overrides=["rollout.top_k=5"])[0]
    assert cfg.rollout.temperature == 0.7 and cfg.rollout.top_k == 5
    from mmgpg.config import ConfigError

    with pytest.raises(ConfigError, match="only field overrides"):
        read_config(run, overrides=["algo=grpo"])
    assert read_config(run, overrides=[f"task={cfg.task.name}"])[0].task.name == cfg.task.name  # the run's own
    with pytest.raises(ConfigError, match="not this run's task"):  # a finished run's task is not swapped
        read_config(run, overrides=["task=lisa_grounding" if cfg.task.name != "lisa_grounding" else "task=shapes"])
    path = run / "probe_success.jsonl"
    rec = ProbeRecord(step=0, prompt_id="a", split="train", samples=4, successes=1, temperature=1.0, top_p=1.0,
                      top_k=0, max_new_tokens=8, checkpoint="m")
    replace_probe(path, [rec])
    replace_probe(path, [dataclasses.replace(rec, step=3)])
    replace_probe(path, [dataclasses.replace(rec, successes=2)])  # re-probing step 0 replaces it
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(r["step"], r["successes"]) for r in rows] == [(3, 1), (0, 2)]
    assert D.read_probes(path) == {3: {"a": (1, 4)}, 0: {"a": (2, 4)}}
    assert D.read_probes(path, split="test") == {}


def test_config_of_an_older_run_is_read_with_its_unknown_keys_named(tmp_path):
    run = tmp_path / "run"
    save_config(resolve(["algo=gpg"]), run, "train")
    text = (run / "config.yaml").read_text().replace("train:\n", "train:\n  retired_option: 3\n", 1)
    (run / "config.yaml").write_text(text)
    cfg, ignored, _ = read_config(run / "config.yaml", lenient=True)
    assert ignored == ["train.retired_option"] and cfg.algo.name == "gpg"
    (run / "config.yaml").write_text(text.replace("group_size: 8", "group_size: eight"))
    from mmgpg.config import ConfigError

    with pytest.raises(ConfigError, match="rollout.group_size"):
        read_config(run / "config.yaml", lenient=True)


def test_current_p_interpolates_probes_in_log_odds():
    probes = {0: {"a": (1, 3)}, 10: {"a": (3, 5)}}  # Jeffreys means 1.5/4 = 0.375 and 3.5/6 = 0.5833
    visits = [visit(0, "a", 1), visit(5, "a", 1), visit(10, "a", 1), visit(20, "a", 1)]
    p, source = D.current_p(visits, probes)
    z0, z1 = math.log(0.375 / 0.625), math.log(0.5833333333 / 0.4166666667)
    assert p[0] == pytest.approx(0.375) and p[2] == pytest.approx(3.5 / 6) and p[3] == pytest.approx(3.5 / 6)
    assert p[1] == pytest.approx(1 / (1 + math.exp(-(z0 + z1) / 2)))  # halfway in log-odds
    assert "interpolated" in source
