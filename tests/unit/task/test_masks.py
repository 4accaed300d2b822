"""LISA mask evaluation (gIoU/cIoU): hand-computed IoUs, GT polygons, RLE, and a tiny random-weight SAM offline."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from mmgpg.task.masks import (
    SamMasker,
    aggregate_mask_ious,
    box_mask,
    decode_rle,
    encode_rle,
    evaluate_masks,
    gt_mask,
    ignore_mask,
    mask_iou,
    polygon_mask,
)

# ----------------------------------------------------------------------------------------------- pure functions


def test_two_overlapping_squares_hand_computed():
    a = box_mask([0, 0, 4, 4], 8, 8)
    b = box_mask([2, 2, 6, 6], 8, 8)
    assert a.dtype == bool and a.shape == (8, 8) and a.sum() == 16 and b.sum() == 16
    inter, union, iou = mask_iou(a, b)
    assert (inter, union) == (4, 28)  # 2x2 overlap; 16 + 16 - 4
    assert iou == pytest.approx(4 / (28 + 1e-6))
    assert mask_iou(a, a)[2] == pytest.approx(1.0, abs=1e-6)
    assert mask_iou(np.zeros((8, 8), bool), np.zeros((8, 8), bool)) == (0, 0, 0.0)  # as the reference: 0 / 1e-6


def test_box_mask_truncates_clips_and_is_half_open():
    m = box_mask([1.9, 2.7, 4.2, 5.99], 10, 6)  # -> int: [1, 2, 4, 5]: columns 1..3, rows 2..4
    assert m.shape == (6, 10) and m.sum() == 3 * 3 and m[2:5, 1:4].all()
    assert box_mask([-5, -5, 100, 100], 7, 3).all()  # clipped to the image
    assert not box_mask([5, 5, 2, 2], 8, 8).any()  # inverted box: empty
    with pytest.raises(ValueError):
        box_mask([1, 2, 3], 8, 8)


def test_polygon_masks_pixel_counts():
    triangle = polygon_mask([(0, 0), (4, 0), (0, 4)], 8, 8)  # pixels with x + y <= 4: 5 + 4 + 3 + 2 + 1
    assert triangle.dtype == bool and triangle.shape == (8, 8) and triangle.sum() == 15
    assert triangle[0, 4] and triangle[4, 0] and not triangle[3, 2]
    rect = polygon_mask([(1, 1), (4, 1), (4, 3), (1, 3)], width=10, height=6)  # outline included: 4 x 3
    assert rect.shape == (6, 10) and rect.sum() == 12 and rect[1:4, 1:5].all()


def test_rle_round_trip_is_json_ready_and_not_transposed():
    rng = np.random.default_rng(0)
    mask = rng.random((13, 7)) > 0.6
    rle = encode_rle(mask)
    assert rle["size"] == [13, 7] and isinstance(rle["counts"], str)
    back = decode_rle(json.loads(json.dumps(rle)))
    assert back.dtype == bool and back.shape == (13, 7) and np.array_equal(back, mask)
    assert np.array_equal(decode_rle({"size": rle["size"], "counts": rle["counts"].encode()}), mask)
    assert np.array_equal(decode_rle(encode_rle(np.zeros((3, 5), bool))), np.zeros((3, 5), bool))
    with pytest.raises(ValueError):
        encode_rle(np.zeros((2, 3, 4), bool))


def test_giou_vs_ciou_two_images_hand_computed():
    # image 1: the two squares above (I=4, U=28); image 2: a perfect 2x5 prediction (I=U=10).
    m = aggregate_mask_ious([(4, 28), (10, 10)])
    assert m["giou"] == pytest.approx((4 / 28 + 1.0) / 2)  # 0.5714: each image weighs the same
    assert m["ciou"] == pytest.approx(14 / 38)  # 0.3684: dominated by the image with the large union
    assert m["n"] == 2
    assert aggregate_mask_ious([]) == {"giou": 0.0, "ciou": 0.0, "n": 0}

    images = [Image.new("RGB", (8, 8)), Image.new("RGB", (6, 3))]
    gts = [box_mask([2, 2, 6, 6], 8, 8), box_mask([1, 0, 6, 2], 6, 3)]
    metrics, per = evaluate_masks("box-as-mask", images, [[0, 0, 4, 4], [1, 0, 6, 2]], gts)
    assert [(s["intersection"], s["union"]) for s in per] == [(4, 28), (10, 10)]
    assert metrics == pytest.approx(m)
    assert np.array_equal(decode_rle(per[0]["rle"]), box_mask([0, 0, 4, 4], 8, 8))


def test_missing_box_scores_zero_and_counts_in_ciou():
    images = [Image.new("RGB", (8, 8)), Image.new("RGB", (8, 8))]
    gts = [box_mask([0, 0, 4, 4], 8, 8), box_mask([0, 0, 4, 4], 8, 8)]
    metrics, per = evaluate_masks("box-as-mask", images, [None, [0, 0, 4, 4]], gts)
    assert per[0]["iou"] == 0.0 and (per[0]["intersection"], per[0]["union"]) == (0, 16)
    assert not decode_rle(per[0]["rle"]).any()
    assert metrics["giou"] == pytest.approx(0.5) and metrics["ciou"] == pytest.approx(16 / 32)


def test_size_mismatch_is_an_error_not_a_skip():
    image = Image.new("RGB", (8, 6))
    with pytest.raises(ValueError, match="differ in size"):
        mask_iou(np.zeros((6, 8), bool), np.zeros((8, 6), bool))
    with pytest.raises(ValueError, match="GT mask"):
        evaluate_masks("box-as-mask", [image], [[0, 0, 2, 2]], [np.zeros((8, 6), bool)])

    class WrongSize:
        def masks(self, images, boxes):
            return [np.zeros((5, 5), bool) for _ in images]

    with pytest.raises(ValueError, match="skips"):
        evaluate_masks(WrongSize(), [image], [[0, 0, 2, 2]], [np.zeros((6, 8), bool)])
    with pytest.raises(ValueError):
        evaluate_masks("sam", [image], [[0, 0, 2, 2]], [np.zeros((6, 8), bool)])


REASONSEG = {
    "text": ["the thing"],
    "is_sentence": True,
    "shapes": [
        {"label": "target", "points": [[0, 0], [5, 0], [5, 5], [0, 5]]},  # 6x6 = 36 px
        {"label": "target", "points": [[8, 6], [10, 6], [10, 8], [8, 8]]},  # 3x3 = 9 px
        {"label": "ignore", "points": [[2, 2], [7, 2], [7, 4], [2, 4]]},  # 6x3 = 18 px, cuts 4x3 out of the first
        {"label": "target", "points": [[6, 3], [6, 3], [6, 3]]},  # 1 px inside the ignore region: stays target
        {"label": "flag", "points": [[9, 0], [9, 9], [0, 9]]},  # deprecated annotation: skipped by LISA
    ],
}


def test_gt_mask_paper_is_first_shape_only():
    gt = gt_mask(REASONSEG, (10, 12))  # size is (height, width)
    assert gt.shape == (10, 12) and gt.sum() == 36 and gt[0:6, 0:6].all()
    assert not ignore_mask(REASONSEG, (10, 12), protocol="paper").any()


def test_gt_mask_strict_unions_targets_minus_ignore():
    size = (10, 12)
    gt = gt_mask(REASONSEG, size, protocol="strict")
    ign = ignore_mask(REASONSEG, size)
    first = polygon_mask(REASONSEG["shapes"][0]["points"], 12, 10)
    second = polygon_mask(REASONSEG["shapes"][1]["points"], 12, 10)
    ignore_poly = polygon_mask(REASONSEG["shapes"][2]["points"], 12, 10)
    dot = np.zeros(size, bool)
    dot[3, 6] = True
    assert gt[3, 6] and not ign[3, 6]  # the small target is painted after the larger ignore polygon
    assert not gt[3, 3] and ign[3, 3]  # the ignore polygon, smaller than the first target, cuts into it
    assert np.array_equal(ign, ignore_poly & ~dot) and ign.sum() == 17
    assert np.array_equal(gt, ((first | second) & ~ignore_poly) | dot) and gt.sum() == 36 - 12 + 9 + 1
    assert not gt[9, 0]  # the "flag" shape is not a target

    # Strict IoU leaves ignore pixels out of both masks: a prediction that also covers the whole ignore region
    # scores exactly like one that does not.
    inter, union, _ = mask_iou(gt | ign, gt, ignore=ign)
    assert (inter, union) == (int(gt.sum()), int(gt.sum()))
    assert mask_iou(gt | ign, gt)[1] == int((gt | ign).sum())  # without ignore: the extra pixels count


def test_gt_mask_errors():
    with pytest.raises(ValueError, match="no shapes"):
        gt_mask({"shapes": []}, (4, 4))
    with pytest.raises(ValueError, match="protocol"):
        gt_mask(REASONSEG, (4, 4), protocol="official")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ tiny SAM


@pytest.fixture(scope="module")
def sam_images():
    rng = np.random.default_rng(1)
    wide = Image.fromarray(rng.integers(0, 255, (30, 50, 3), dtype=np.uint8))  # 50 x 30
    tall = Image.fromarray(rng.integers(0, 255, (71, 40, 3), dtype=np.uint8))  # 40 x 71
    gray = Image.fromarray(rng.integers(0, 255, (20, 25), dtype=np.uint8), mode="L")  # not RGB: converted
    return [wide, tall, gray]


def test_tiny_sam_masks_have_each_image_size(tiny_sam_dir, sam_images):
    masker = SamMasker(tiny_sam_dir)
    boxes = [[5.7, 4.2, 30.9, 20.0], [1, 2, 30, 60], None]
    masks = masker.masks(sam_images, boxes, batch_size=8)
    assert len(masks) == 3
    for mask, image in zip(masks, sam_images):
        assert isinstance(mask, np.ndarray) and mask.dtype == bool and mask.shape == (image.height, image.width)
        assert np.array_equal(decode_rle(encode_rle(mask)), mask)
    assert not masks[2].any()  # None box: all False, SAM not run

    one_by_one = masker.masks(sam_images, boxes, batch_size=1)  # batching does not change the answer
    for a, b in zip(masks, one_by_one):
        assert a.shape == b.shape and (a != b).mean() < 0.01
    assert masker.masks([], []) == []
    with pytest.raises(ValueError):
        masker.masks(sam_images, boxes[:2])


def test_tiny_sam_evaluate_masks(tiny_sam_dir, sam_images):
    masker = SamMasker(str(tiny_sam_dir))
    boxes = [[5, 4, 30, 20], [1, 2, 30, 60], None]
    gts = [
        box_mask(b, im.width, im.height) if b else box_mask([0, 0, 9, 9], im.width, im.height)
        for b, im in zip(boxes, sam_images)
    ]
    metrics, per = evaluate_masks(masker, sam_images, boxes, gts)
    assert 0.0 <= metrics["giou"] <= 1.0 and 0.0 <= metrics["ciou"] <= 1.0 and metrics["n"] == 3
    assert [set(s) for s in per] == [{"iou", "intersection", "union", "rle"}] * 3
    for s, gt, image in zip(per, gts, sam_images):
        pred = decode_rle(s["rle"])
        assert s["rle"]["size"] == [image.height, image.width]
        inter = int(np.logical_and(pred, gt).sum())
        union = int(np.logical_or(pred, gt).sum())
        assert (s["intersection"], s["union"]) == (inter, union)
        assert s["iou"] == pytest.approx(inter / (union + 1e-6))
    assert per[2]["iou"] == 0.0 and per[2]["union"] == 81
    expected = aggregate_mask_ious((s["intersection"], s["union"]) for s in per)
    assert metrics == pytest.approx(expected)
    assert metrics["giou"] == pytest.approx(np.mean([s["iou"] for s in per]))


def test_missing_checkpoint_gives_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="facebook/sam-vit-huge") as err:
        SamMasker(tmp_path / "no_such_sam")
    assert "download" in str(err.value) and "--local-dir" in str(err.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(OSError, match="could not be loaded"):
        SamMasker(empty)
    with pytest.raises(OSError, match="facebook/sam-vit-huge"):
        SamMasker("mmgpg-test-nobody/no-such-sam")  # a hub id: local cache only, never the network
