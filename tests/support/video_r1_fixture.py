"""A small Video-R1 data folder in the published schema (``Video-R1-260k.json`` / ``eval_<benchmark>.json`` with
media paths starting ``./`` relative to the JSON's folder), written with real H.264 files (PyAV) and a PNG, for the
``video_r1`` task's tests. The records cover every problem type of the benchmarks (multiple choice, numerical,
regression) and of training (plus OCR and free-form), a video and an image."""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image, ImageDraw

from support.conversations import write_video


def _clip(n: int, colour) -> list:
    frames = []
    for t in range(n):
        frame = Image.new("RGB", (64, 64), (123, 117, 104))
        ImageDraw.Draw(frame).rectangle((4 + 6 * t, 20, 20 + 6 * t, 36), fill=colour)
        frames.append(frame)
    return frames


RECORDS = [
    {"problem_id": 1, "problem": "Which way does the square move?", "data_type": "video",
     "problem_type": "multiple choice", "options": ["A. left", "B. right", "C. up", "D. down"],
     "solution": "<answer>B</answer>", "path": "./clips/right.mp4", "data_source": "fixture-motion"},
    {"problem_id": 2, "problem": "How many squares are in the video?", "data_type": "video",
     "problem_type": "numerical", "options": [], "solution": "<answer>1</answer>", "path": "./clips/red.mp4",
     "data_source": "fixture-count"},
    {"problem_id": 3, "problem": "How far does the square travel, in pixels?", "data_type": "video",
     "problem_type": "regression", "options": [], "solution": "<answer>42</answer>", "path": "./clips/right.mp4",
     "data_source": "fixture-motion"},
    {"problem_id": 4, "problem": "What colour is the square?", "data_type": "image", "problem_type": "free-form",
     "options": [], "solution": "<answer>red</answer>", "path": "./images/red.png", "data_source": "fixture-image"},
    {"problem_id": 5, "problem": "Read the text.", "data_type": "image", "problem_type": "OCR", "options": [],
     "solution": "<answer>STOP</answer>", "path": "./images/red.png", "data_source": "fixture-image"},
]


def write_video_r1(root: Path, benchmark: str = "mvbench") -> dict[str, Path]:
    """``{"train": root/Video-R1-260k.json, "eval": root/eval/eval_<benchmark>.json}`` with their media."""
    root.mkdir(parents=True, exist_ok=True)
    for base in (root, root / "eval"):
        write_video(base / "clips" / "right.mp4", _clip(8, (220, 40, 40)), 4)
        write_video(base / "clips" / "red.mp4", _clip(4, (40, 80, 220)), 2)
        (base / "images").mkdir(parents=True, exist_ok=True)
        _clip(1, (220, 40, 40))[0].save(base / "images" / "red.png")
    train = root / "Video-R1-260k.json"
    train.write_text(json.dumps(RECORDS))
    evaluation = root / "eval" / f"eval_{benchmark}.json"
    evaluation.write_text(json.dumps([r for r in RECORDS if r["problem_type"] in
                                      ("multiple choice", "numerical", "regression")]))
    return {"train": train, "eval": evaluation}
