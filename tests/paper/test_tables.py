"""eval/paper_tables.yaml holds the GPG paper's numbers consistently; eval/render.py puts our results beside them."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import REPO as _REPO

REPO = _REPO
RENDER = REPO / "eval" / "render.py"
TABLES = REPO / "eval" / "paper_tables.yaml"
CV_BENCH_ITEMS = {"Count": 788, "Relation": 650, "Depth": 600, "Distance": 600}


@pytest.fixture(scope="module")
def render():
    spec = importlib.util.spec_from_file_location("eval_render", RENDER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def tables():
    return yaml.safe_load(TABLES.read_text())["tables"]


def rows_by_name(table):
    return {row["name"]: row["values"] for row in table["rows"]}


# (a) the paper's numbers ----------------------------------------------------------------------------------------


def test_yaml_has_every_table_and_row(tables, render):
    assert set(tables) == {"cv_bench", "lisa_grounding", "fine_grained", "geoqa", "math_1p5b", "math_7b",
                           "math_7b_ablation"}
    assert render.load_paper_tables() == tables
    for table in tables.values():
        assert table["source"].strip()
        for row in table["rows"]:
            assert set(row["values"]) == set(table["columns"]), (table["title"], row["name"])
    assert [r["name"] for r in tables["cv_bench"]["rows"]] == ["Qwen2-VL-2B", "+ SFT", "+ GRPO", "+ GPG"]
    assert rows_by_name(tables["geoqa"])["+ SFT"] == {"GEOQA_test": None}  # the paper has no SFT row
    assert rows_by_name(tables["lisa_grounding"])["+ GPG"] == {"mIoU_test": 51.8, "mIoU_val": 51.3, "gIoU_test": 50.4}
    assert tables["cv_bench"]["denominator"] == 2638 and tables["cv_bench"]["items"] == CV_BENCH_ITEMS
    assert tables["geoqa"]["denominator"] == 754


def truncated(correct: int, n: int) -> float:
    return math.floor(1e4 * correct / n) / 100


def cv_bench_correct(values) -> dict[str, int]:
    return {col: round(values[col] / 100 * n) for col, n in CV_BENCH_ITEMS.items()}


@pytest.mark.parametrize("name,total_correct", [("+ SFT", 1526), ("+ GRPO", 1569), ("+ GPG", 2009)])
def test_cv_bench_total_is_truncated_micro_accuracy(tables, name, total_correct):
    values = rows_by_name(tables["cv_bench"])[name]
    correct = cv_bench_correct(values)
    assert sum(correct.values()) == total_correct
    assert values["Total"] == pytest.approx(truncated(sum(correct.values()), 2638), abs=1e-9)
    for col, k in correct.items():  # the per-task values are truncated too
        assert values[col] == pytest.approx(truncated(k, CV_BENCH_ITEMS[col]), abs=1e-9), col


def test_cv_bench_base_row_total_is_the_known_inconsistency(tables):
    values = rows_by_name(tables["cv_bench"])["Qwen2-VL-2B"]
    correct = cv_bench_correct(values)
    assert correct == {"Count": 431, "Relation": 146, "Depth": 1, "Distance": 190}
    assert truncated(768, 2638) == pytest.approx(29.11)
    assert values["Total"] == 31.38  # as printed, although the per-task values imply 29.11


def test_classification_average_is_the_mean_of_four(tables):
    for name, values in rows_by_name(tables["fine_grained"]).items():
        mean = sum(values[c] for c in ("Flower102", "Pets37", "FGVC", "Cars196")) / 4
        assert values["Average"] == pytest.approx(mean, abs=0.05), name


def test_geoqa_values_are_rounded_counts_over_754(tables):
    for name, values in rows_by_name(tables["geoqa"]).items():
        if values["GEOQA_test"] is not None:
            correct = round(values["GEOQA_test"] / 100 * 754)
            assert round(100 * correct / 754, 2) == values["GEOQA_test"], name


MATH_TABLES = ("math_1p5b", "math_7b", "math_7b_ablation")
MATH_COLUMNS = ("AIME24", "MATH-500", "AMC23", "Minerva", "OlympiadBench")


@pytest.mark.parametrize("key", MATH_TABLES)
def test_math_average_is_the_mean_of_the_five_benchmarks(tables, key):
    """Average = unweighted mean of the five benchmarks, to the printed 0.1 (hand check, GPG-RS1:
    (33.3 + 87.6 + 77.5 + 29.4 + 50.5) / 5 = 55.66 -> 55.7); the one row that breaks it is recorded in the notes."""
    table = tables[key]
    assert table["tasks"] == {"AIME24": "aime24", "MATH-500": "math_500", "AMC23": "amc23", "Minerva": "minerva",
                              "OlympiadBench": "olympiadbench"}
    off = []
    for name, values in rows_by_name(table).items():
        five = [values[c] for c in MATH_COLUMNS]
        if None in five:
            assert values["Average"] is None, name
            continue
        if abs(sum(five) / 5 - values["Average"]) > 0.05 + 1e-9:
            off.append(name)
    known = {"math_7b": ["Qwen2.5-Math-7B (no template)"],  # 34.2 printed as 38.2
             "math_7b_ablation": ["GPG (F_norm=1, alpha=B/(B-M), beta_th=0.6)"]}  # 48.38 printed as 48.3
    assert off == known.get(key, []), off
    assert rows_by_name(tables["math_1p5b"])["GPG-RS1"]["Average"] == 55.7
    assert rows_by_name(tables["math_7b"])["GPG-7B"]["Average"] == 57.7


def test_format_percent(render):
    assert render.format_percent(100 * 2009 / 2638, 2, "truncate") == "76.15"
    assert render.format_percent(100 * 2009 / 2638, 2, "round") == "76.16"
    assert render.format_percent(100 * 0.29, 2, "truncate") == "29.00"  # 28.999999999999996 is float noise
    assert render.format_percent(100 * 490 / 600, 2, "truncate") == "81.66"
    assert render.format_percent(None, 1) == "—"


# (b) rendering ---------------------------------------------------------------------------------------------------


def write_result(path: Path, task: str, metrics: dict, *, split="test", protocol="paper", checkpoint="ckpt",
                 task_options=None, counts=None, **extra) -> Path:
    path.mkdir(parents=True)
    payload = {"metrics": metrics, "task": task, "task_version": "1", "protocol": protocol, "split": split,
               "checkpoint": checkpoint, "config": {"task": {"name": task, **(task_options or {})}, "model": {}},
               "counts": counts or {}, "written": "2025-01-01 00:00:00", **extra}
    (path / "metrics.json").write_text(json.dumps(payload))
    return path


def run_render(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RENDER), *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_render_fills_every_family(tmp_path):
    cvb = write_result(tmp_path / "cvb", "cv_bench",
                       {"total": 2009 / 2638, "count": 525 / 788, "relation": 541 / 650, "depth": 490 / 600,
                        "distance": 453 / 600, "num_samples": 2638.0},
                       checkpoint="/runs/gpg/ckpt-x", counts={"evaluated": 2638})
    geo = write_result(tmp_path / "geo", "geoqa", {"accuracy": 0.51}, protocol="strict",
                       checkpoint="Qwen/Qwen2.5-VL-3B-Instruct", counts={"evaluated": 100}, limit=100)
    flowers = write_result(tmp_path / "flowers", "fine_grained", {"accuracy": 0.7931},
                           task_options={"dataset": "oxford_flowers"})
    pets = write_result(tmp_path / "pets", "fine_grained", {"accuracy": 0.9084}, task_options={"dataset": "pets"})
    lisa_test = write_result(tmp_path / "lisa_test", "lisa_grounding", {"miou": 0.5183, "giou": 0.5041},
                             checkpoint="runs/lisa-run")
    lisa_val = write_result(tmp_path / "lisa_val", "lisa_grounding", {"miou": 0.5129}, split="val",
                            checkpoint="runs/lisa-run")
    other = write_result(tmp_path / "shapes", "shapes", {"accuracy": 0.5})
    out = tmp_path / "report"
    proc = run_render(cvb, geo, f"{flowers}=fg-2b", pets / "metrics.json", "--label-for", f"{pets}=fg-2b",
                      lisa_test, lisa_val, other, "--out", out)
    assert proc.returncode == 0, proc.stderr
    md = (out / "tables.md").read_text()
    assert proc.stdout == md
    lines = md.splitlines()
    for expected in [
        "| + GPG | 76.15 | 66.62 | 83.23 | 81.66 | 75.50 |",
        "| ours: ckpt-x (paper) | 76.15 | 66.62 | 83.23 | 81.66 | 75.50 |",  # truncated like the paper
        "| + SFT | — |",
        "| ours: Qwen2.5-VL-3B-Instruct (strict)† | 51.00 |",
        "†: evaluated on 100 of 754 items; limit=100",
        "| ours: fg-2b (paper) | — | 79.3 | 90.8 | — | — |",  # no Average until all four datasets are in
        "| ours: lisa-run (paper) | 51.8 | 51.3 | 50.4 |",
    ]:
        assert expected in lines, expected
    headings = [line for line in lines if line.startswith("## ")]
    assert headings == ["## CV-Bench (Qwen2-VL-2B)", "## LISA reasoning grounding (Qwen2-VL-2B)",
                        "## Fine-grained 4-shot classification (Qwen2-VL-2B)", "## GEOQA (Qwen2.5-VL-3B-Instruct)"]
    assert sum(line.startswith("*Source: AMAP-ML/GPG README") for line in lines) == 4
    assert "task 'shapes' has no table" in proc.stderr and str(other / "metrics.json") in proc.stderr
    png = (out / "tables.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_render_average_and_unused_tables(tmp_path, render):
    datasets = {"oxford_flowers": 0.80, "pets": 0.90, "fgvc_aircraft": 0.70, "stanford_cars": 0.96}
    results = [render.load_result(write_result(tmp_path / name, "fine_grained", {"accuracy": acc},
                                               checkpoint="runs/all4/final", task_options={"dataset": name}))
               for name, acc in datasets.items()]
    data = render.fill_tables(results)
    assert [t["key"] for t in data] == ["fine_grained"]
    md = render.render_markdown(data)
    assert "| ours: all4/final (paper) | 84.0 | 80.0 | 90.0 | 70.0 | 96.0 |" in md.splitlines()
    everything = render.fill_tables(results, include_all=True)
    assert [t["key"] for t in everything] == ["cv_bench", "lisa_grounding", "fine_grained", "geoqa", *MATH_TABLES]
    assert render.render_png(everything, tmp_path / "all.png").stat().st_size > 10_000


def test_render_math_results_need_a_table_and_fill_their_benchmark_column(tmp_path):
    """A benchmark result fills its column of the chosen math table with pass@1; a greedy one is footnoted; one
    without --table is an error (three tables take the same tasks); the Average appears once all five are in."""
    results = {task: write_result(tmp_path / task, task, {"pass@1": value, "accuracy": 0.0},
                                  checkpoint="runs/rs1/final", counts={"evaluated": n})
               for task, value, n in [("aime24", 10 / 30, 30), ("math_500", 0.876, 500), ("amc23", 0.775, 40),
                                      ("minerva", 0.294, 272), ("olympiadbench", 0.505, 675)]}
    proc = run_render(results["aime24"], "--out", tmp_path / "o1")
    assert proc.returncode == 2 and "choose one with --table" in proc.stderr, proc.stderr
    out = tmp_path / "o2"
    proc = run_render(*results.values(), "--table", "math_1p5b", "--out", out)
    assert proc.returncode == 0, proc.stderr
    lines = (out / "tables.md").read_text().splitlines()
    assert "| ours: rs1/final (paper) | 55.7 | 33.3 | 87.6 | 77.5 | 29.4 | 50.5 |" in lines
    assert [line for line in lines if line.startswith("## ")] == [
        "## Math reasoning, distilled 1.5B models (DeepSeek-R1-Distill-Qwen-1.5B)"]
    greedy = write_result(tmp_path / "greedy", "math_500", {"accuracy": 0.5}, checkpoint="base",
                          counts={"evaluated": 100}, limit=100)
    proc = run_render(greedy, "--table", "math_7b", "--out", tmp_path / "o3")
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "o3" / "tables.md").read_text()
    assert "| ours: base (paper)† | — | — | 50.0 | — | — | — |" in md.splitlines(), md
    assert ("†: MATH-500: greedy accuracy (the paper reports pass@1 over sampled completions); evaluated on 100 of "
            "500 items; limit=100") in md.splitlines(), md
    proc = run_render(greedy, "--table", "nope", "--out", tmp_path / "o4")
    assert proc.returncode == 2 and "no such table" in proc.stderr
    # `mmgpg eval --task aime24,math_500,...` writes one folder per benchmark and a summary metrics.json naming them:
    # the summary's folder fills every column it names, under one label.
    multi = tmp_path / "multi"
    for task, value in [("aime24", 11 / 30), ("math_500", 0.846), ("amc23", 0.825), ("minerva", 0.39),
                        ("olympiadbench", 0.458)]:
        write_result(multi / task, task, {"pass@1": value}, checkpoint="runs/gpg7b")
    (multi / "metrics.json").write_text(json.dumps({
        "metrics": {"average/pass@1": 0.577}, "checkpoint": "runs/gpg7b", "protocol": "paper",
        "benchmarks": {t: {"dir": t} for t in ("aime24", "math_500", "amc23", "minerva", "olympiadbench")}}))
    proc = run_render(f"{multi}=gpg-7b", "--table", "math_7b", "--out", tmp_path / "o5")
    assert proc.returncode == 0, proc.stderr
    assert "| ours: gpg-7b (paper) | 57.7 | 36.7 | 84.6 | 82.5 | 39.0 | 45.8 |" in \
        (tmp_path / "o5" / "tables.md").read_text().splitlines()


# (c) errors ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content,problem", [
    (None, "no such file or directory"),
    ('{"metrics": ', "invalid JSON"),
    ('{"task": "geoqa"}', "no 'metrics' key"),
    ('{"metrics": {"accuracy": 0.5}}', "no 'task' key"),
])
def test_errors_exit_2_naming_the_file(tmp_path, content, problem):
    path = tmp_path / "run" / "metrics.json"
    if content is not None:
        path.parent.mkdir()
        path.write_text(content)
    proc = run_render(path, "--out", tmp_path / "out")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(path) in proc.stderr and problem in proc.stderr
    assert not (tmp_path / "out" / "tables.md").exists()
