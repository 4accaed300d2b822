"""``moving_shapes`` with ``task.kind=total`` (the video demo's task): what a clip shows is what its answer says,
counted from the pixels (connected blobs of non-background colour, scipy's labelling), and no frame shows it all."""

from __future__ import annotations

import numpy as np
import pytest
from mmgpg_tasks.moving_shapes import MovingShapesTask
from mmgpg_tasks.shapes import BACKGROUND

ndimage = pytest.importorskip("scipy.ndimage")


def _masks(frames) -> list[np.ndarray]:
    return [np.any(np.asarray(f, dtype=np.int16) != np.array(BACKGROUND, dtype=np.int16), axis=-1) for f in frames]


def test_total_clips_hold_their_answer_spread_over_frames():
    task = MovingShapesTask(kind="total")
    answers = []
    for index in range(60):
        ex = task.example("train", index)
        [video] = ex.media
        assert video["type"] == "video" and len(video["video"]) == task.frames
        masks = _masks(video["video"])
        blobs = [ndimage.label(m)[1] for m in masks]
        assert sum(blobs) == ex.answer, (index, blobs)  # every shape is drawn once, in one frame
        assert max(blobs) < ex.answer or ex.answer == 1, "one frame alone must not show every shape"
        assert (np.sum(masks, axis=0) <= 1).all(), "shapes of different frames overlap"
        answers.append(ex.answer)
        assert task.rewards["accuracy"](task.gold_completion(ex), ex) == 1.0
    assert set(answers) == {1, 2, 3, 4, 5}
    assert task.example("test", 3).media[0]["video"][0].size == (task.size, task.size)


def test_kind_is_checked():
    with pytest.raises(ValueError, match="count, total or direction"):
        MovingShapesTask(kind="speed")
