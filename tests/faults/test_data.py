"""Bad data rows and images, as real files: every error names the file, the row (line) and the field or image path;
images are converted faithfully or refused; `data.on_bad_row=skip` skips and counts instead of stopping."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support.faults_support import mmgpg, steps

from mmgpg.task import SkipBadRows, build_task, good_items
from mmgpg.task.data import DataError, DataNotFound, open_image


def _png(path: Path, size=(64, 48), colour=(200, 30, 30)) -> Path:
    Image.new("RGB", size, colour).save(path)
    return path


def _bomb(path: Path) -> Path:
    """A tiny PNG whose header claims 20000 x 20000 pixels (IHDR patched, CRC recomputed)."""
    data = bytearray((_png(path, (1, 1))).read_bytes())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4: ihdr + 12] = struct.pack(">II", 20000, 20000)
    data[ihdr + 17: ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(data[ihdr: ihdr + 17])))
    path.write_bytes(bytes(data))
    return path


@pytest.fixture
def geoqa_rows(tmp_path):
    """A GEOQA training file: good rows around one bad row of each kind; returns (path, {kind: line})."""
    good = _png(tmp_path / "good.png")
    truncated = tmp_path / "truncated.png"
    noisy = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    noisy.save(truncated)
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    (tmp_path / "a_directory.png").mkdir()
    _png(tmp_path / "thin.png", (500, 2))
    ok = {"image": str(good), "problem": "Find x.", "solution": "<answer> 65 </answer>"}
    bad = {
        "truncated image": (json.dumps({**ok, "image": str(truncated)}), "truncated.png"),
        "directory image": (json.dumps({**ok, "image": str(tmp_path / "a_directory.png")}), "is a directory"),
        "decompression bomb": (json.dumps({**ok, "image": str(_bomb(tmp_path / "bomb.png"))}), "decompression bomb"),
        "1:250 aspect ratio": (json.dumps({**ok, "image": str(tmp_path / "thin.png")}), "aspect ratio"),
        "missing image": (json.dumps({**ok, "image": str(tmp_path / "nope.png")}), "nope.png' does not exist"),
        "not UTF-8": ('{"image": "x", "problem": "\xe9t\xe9", "solution": "1"}', "not UTF-8"),
        "JSON array": ("[1, 2]", "must be a JSON object"),
        "null line": ("null", "must be a JSON object"),
        "number as text": (json.dumps({**ok, "problem": 5}), "field 'problem' must be text"),
        "list as gold": (json.dumps({**ok, "solution": ["a", "b"]}), "field 'solution' must be text"),
        "missing field": (json.dumps({"image": str(good), "problem": "p"}), "lacks solution"),
    }
    lines, where = [], {}
    for kind, (line, message) in bad.items():
        lines.append(json.dumps(ok))
        lines.append(line)
        where[kind] = (len(lines), message)
    lines.append(json.dumps(ok))
    path = tmp_path / "train.jsonl"
    path.write_bytes(b"\n".join(x.encode("latin-1") if "\xe9" in x else x.encode() for x in lines) + b"\n")
    return path, where


def test_every_bad_row_names_file_line_and_field(geoqa_rows):
    path, where = geoqa_rows
    items = build_task("geoqa", {"train_data": str(path)}).load("train")
    for kind, (line, message) in where.items():
        with pytest.raises((DataError, DataNotFound)) as caught:
            items[line - 1]
        text = str(caught.value)
        assert text.startswith(f"{path}:{line}: ") and message in text, (kind, text)
        items[line - 2]  # noqa: B018 - the row before it is fine


def test_skip_mode_skips_each_bad_row_once_and_counts_it(geoqa_rows):
    path, where = geoqa_rows
    warnings: list[str] = []
    items = SkipBadRows(build_task("geoqa", {"train_data": str(path)}).load("train"), "skip", warnings.append)
    got = [items[i].question for i in range(len(items))]
    assert all(q.startswith("Find x.") for q in got)
    assert sorted(items.skipped) == sorted(line - 1 for line, _ in where.values())
    assert len(warnings) == len(where)
    examples, skipped = good_items(build_task("geoqa", {"train_data": str(path)}).load("train"), None, "skip")
    assert len(examples) == len(items) - len(where) and sorted(skipped) == sorted(items.skipped)
    with pytest.raises(DataError):
        SkipBadRows(build_task("geoqa", {"train_data": str(path)}).load("train"), "error")[where["null line"][0] - 1]


def test_images_are_converted_faithfully(tmp_path):
    grey16 = tmp_path / "grey16.png"
    Image.fromarray(np.full((8, 8), 32768, dtype=np.uint16)).save(grey16)
    assert Image.open(grey16).mode.startswith("I")  # really a 16-bit file
    assert open_image(grey16).getpixel((0, 0)) == (128, 128, 128)  # PIL's own convert("RGB") gives white
    rgba = tmp_path / "rgba.png"
    Image.new("RGBA", (8, 8), (0, 0, 0, 0)).save(rgba)  # fully transparent black
    assert open_image(rgba).getpixel((0, 0)) == (255, 255, 255)
    palette = tmp_path / "palette.png"
    p = Image.new("P", (8, 8), 0)
    p.putpalette([0, 0, 0, 10, 200, 10] + [0] * 762)
    p.putpixel((1, 1), 1)
    p.save(palette, transparency=0)
    image = open_image(palette)
    assert image.getpixel((0, 0)) == (255, 255, 255) and image.getpixel((1, 1)) == (10, 200, 10)


def test_train_stops_with_one_message_or_skips_and_counts(tmp_path):
    good = _png(tmp_path / "good.png")
    broken = tmp_path / "broken.png"
    _png(broken, (64, 64))
    broken.write_bytes(broken.read_bytes()[:60])
    rows = [{"image": str(good), "problem": f"Find x{i}.", "solution": "<answer> 65 </answer>"} for i in range(8)]
    rows[5]["image"] = str(broken)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["train", "model=tiny", "task=geoqa", f"task.train_data={data}", "rollout.group_size=2",
            "rollout.max_new_tokens=4", "train.prompts_per_step=4", "train.max_steps=2", "train.progress=false",
            "train.tensorboard=false"]
    proc = mmgpg(*args, f"output_dir={tmp_path / 'stop'}", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{data}:6: GEOQA train image '{broken}': damaged image" in proc.stderr
    proc = mmgpg(*args, "data.on_bad_row=skip", f"output_dir={tmp_path / 'skip'}")
    assert f"{data}:6" in proc.stderr and "skipped bad data row" in proc.stderr
    metrics = [json.loads(x) for x in (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()]
    assert steps(tmp_path / "skip") == [1, 2] and metrics[-1]["data/skipped_rows"] == 1


@pytest.fixture
def geoqa_eval_split(tmp_path):
    """GEOQA files for a run: 4 good training rows, and a 5-row test split whose row 2 (line 3) is a damaged image.
    Returns (task options, the test file)."""
    good, broken = _png(tmp_path / "good.png"), _png(tmp_path / "broken.png", (64, 64))
    broken.write_bytes(broken.read_bytes()[:60])
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"image": str(good), "problem": f"Find x{i}.",
                                         "solution": "<answer> 65 </answer>"}) + "\n" for i in range(4)))
    rows = [{"image_path": str(broken if i == 2 else good), "question": f"Find y{i}.", "ground_truth": "65°"}
            for i in range(5)]
    test = tmp_path / "test.jsonl"
    test.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"train_data": str(train), "test_data": str(test)}, test


def test_evaluation_leaves_out_a_bad_row_under_skip_and_stops_on_it_otherwise(geoqa_eval_split, tiny_dirs, capsys):
    from mmgpg.evaluation.run import run_evaluation
    from mmgpg.models.load import load_policy
    from mmgpg.rollout.hf import HFEngine

    options, test = geoqa_eval_split
    task = build_task("geoqa", options)
    policy = load_policy(str(tiny_dirs["qwen2_vl"]), dtype="float32", min_pixels=3136, max_pixels=12544, device="cpu")
    engine = HFEngine(policy)
    kwargs = {"limit": None, "max_new_tokens": 4, "batch_size": 2, "checkpoint": "tiny", "engine_name": "hf"}
    report = run_evaluation(engine, task, "test", on_bad_row="skip", **kwargs)
    assert [r["id"] for r in report.judged] == [f"geoqa-test-{i}" for i in (0, 1, 3, 4)]
    assert [ex.id for ex in report.examples] == [r["id"] for r in report.judged]
    assert report.records[-1]["row"] == 2 and report.records[-1]["skipped"].startswith(f"{test}:3: ")
    assert report.counts == {"evaluated": 4, "skipped": 1, "available": 5,
                             "parse_failures": sum(r["parse_failure"] for r in report.judged)}
    assert report.metrics["num_samples"] == 4 and report.title() == "geoqa (test, protocol=paper, 4 items, 1 skipped)"
    assert f"skipped bad data row 2: {test}:3: " in capsys.readouterr().err
    with pytest.raises(DataError, match=f"{test}:3: GEOQA test image .*damaged image"):
        run_evaluation(engine, task, "test", on_bad_row="error", **kwargs)


@pytest.mark.parametrize("command", ["train", "sft"])
def test_training_evaluation_skips_a_bad_eval_row_or_stops_with_its_line(geoqa_eval_split, tmp_path, command):
    """The eval split's bad row: left out of train.eval_* under data.on_bad_row=skip, a stop naming it otherwise."""
    from mmgpg.config import resolve
    from mmgpg.train.sft import SFTTrainer
    from mmgpg.train.trainer import Trainer

    options, test = geoqa_eval_split
    args = ["model=tiny", "task=geoqa", *(f"task.{k}={v}" for k, v in options.items()), "rollout.group_size=2",
            "rollout.max_new_tokens=4", "train.prompts_per_step=2", "train.max_steps=1", "train.eval_every=1",
            "train.eval_limit=0", "train.progress=false", "train.tensorboard=false", "sft.max_steps=1",
            "sft.batch_size=2", "algo.min_valid_fraction=0"]
    make = Trainer if command == "train" else SFTTrainer
    run = make(resolve([*args, "data.on_bad_row=skip"]), run_dir=tmp_path / "skip")
    run.train()
    logged = [json.loads(x) for x in (tmp_path / "skip" / "metrics.jsonl").read_text().splitlines()]
    evals = [m for m in logged if "eval/num_samples" in m]
    assert evals and all(m["eval/num_samples"] == 4 and "eval/accuracy" in m for m in evals)
    with pytest.raises(DataError, match=f"{test}:3: GEOQA test image"):
        make(resolve(args), run_dir=tmp_path / "stop").train()
