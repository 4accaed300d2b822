"""The mask half of LISA reasoning-grounding evaluation (the "gIoU" of the GPG paper): box -> SAM mask -> IoU.

The policy only predicts a box; the paper's gIoU turns that box into a mask with SAM and scores the mask against the
ReasonSeg polygon annotation. This module reproduces the reference implementation of Visual-RFT
(https://github.com/Liuziyu77/Visual-RFT), folder ``lisa_evaluation/``:

* ``lisa_evaluation/README.md``: "to compute gIoU ... 1. Use ``box2mask.py`` to extract mask from SAM, 2. Use
  ``mask_iou`` to compute mask IoU".
* ``lisa_evaluation/box2mask.py``: for each image the predicted box, in absolute pixels of the ORIGINAL image and
  truncated to ints (``int(x1 * width)``, ... -- there the model's 0..1000 box is first divided by 1000), is given to
  ``SamPredictor.predict_torch(boxes=..., multimask_output=False)`` of SAM ViT-H (``sam_vit_h_4b8939.pth``); the one
  mask is stored as COCO RLE (``pycocotools.mask.encode(np.asfortranarray(mask.astype(np.uint8)))``).
* ``lisa_evaluation/mask_iou.py``: the GT mask is ``shapes[0]["points"]`` of the ReasonSeg JSON filled with
  ``PIL.ImageDraw.polygon(points, outline=1, fill=1)``; per image ``I = |P & G|``, ``U = |P | G|``,
  ``IoU = I / (U + 1e-6)``; then

      gIoU = mean_i I_i / (U_i + 1e-6)           (mean of per-image IoUs)
      cIoU = sum_i I_i / (sum_i U_i + 1e-6)      (cumulative IoU)

Here: :class:`SamMasker` (transformers' ``SamModel``/``SamProcessor``) -> :func:`encode_rle` / :func:`decode_rle`
-> :func:`gt_mask` -> :func:`mask_iou` -> :func:`aggregate_mask_ious`; :func:`evaluate_masks` runs the chain.

Quirks of the reference, and what this module does about them:

* GT = the FIRST shape only, whatever its label. Official LISA (``utils/data_processing.py:get_mask_from_json``)
  unions every polygon except those labelled "flag", paints them largest-area first so smaller ones win, marks
  polygons whose label contains "ignore" as ignored (255) and leaves those pixels out of the IoU. ``gt_mask(...,
  protocol="paper")`` is the reference; ``protocol="strict"`` is the official one, and :func:`ignore_mask` gives its
  ignored pixels, which :func:`mask_iou` removes from BOTH the prediction and the GT (as LISA's
  ``intersectionAndUnionGPU`` with ``ignore_index=255`` does). LISA rasterises with cv2 on int32-truncated points;
  we use PIL in both protocols, so the strict GT can differ from LISA's by a pixel along polygon edges. LISA also
  scores an image whose union is empty as IoU 1; we keep ``0 / (0 + 1e-6) = 0`` in both protocols.
* A JSON without shapes is skipped by the reference ("no res"); :func:`gt_mask` raises ``ValueError`` instead.
* An image without a predicted box (an unparsable answer) should get an all-zero mask, IoU 0. The reference means
  to do so but crashes (it reads ``size`` before assigning it, or reuses the previous image's); here a ``None`` box
  gives an all-False mask, IoU 0, and counts in gIoU and cIoU (its union is the GT area).
* The reference SKIPS (``continue``: counted in neither gIoU nor cIoU) a prediction whose RLE size differs from the
  image. We treat a size mismatch as an error: ``ValueError``.
* SAM: transformers' port (``facebook/sam-vit-huge`` = ``sam_vit_h_4b8939.pth``) resizes the longest side to 1024,
  pads to 1024x1024, upsamples the low-res logits to 1024, crops the padding, resizes to the original size and
  thresholds at 0 -- the same steps as ``SamPredictor``, but resizing happens in torchvision rather than PIL, so the
  masks are numerically close to, not bit-identical with, the reference's.
* Images are used as PIL opens them (no EXIF transposition): the reference reads the GT size with PIL, and the
  ReasonSeg polygons are in that pixel frame.
* :func:`box_mask` ("box-as-mask": the filled predicted rectangle) is a SAM-less fallback for when no SAM checkpoint
  is at hand. It is NOT the paper's gIoU; report it under its own name.

Getting a SAM checkpoint (this module never downloads): on a machine with internet run
``hf download facebook/sam-vit-huge --local-dir DIR`` (older huggingface_hub: ``huggingface-cli download
facebook/sam-vit-huge --local-dir DIR``), copy ``DIR`` over, and pass its path as ``SamMasker(DIR)``. A bare hub id
(``SamMasker("facebook/sam-vit-huge")``) is looked up in the local Hugging Face cache only.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
from PIL import Image, ImageDraw
from pycocotools import mask as mask_utils

Box = Sequence[float]
EPS = 1e-6
SAM_HUB_ID = "facebook/sam-vit-huge"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


# --------------------------------------------------------------------------------------------------------- masks


def polygon_mask(points: Iterable[Sequence[float]], width: int, height: int) -> np.ndarray:
    """The (height, width) bool mask of a polygon, outline included (PIL ``polygon(outline=1, fill=1)``)."""
    pts = [(float(p[0]), float(p[1])) for p in points]
    canvas = Image.new("L", (int(width), int(height)), 0)
    if len(pts) >= 2:
        ImageDraw.Draw(canvas).polygon(pts, outline=1, fill=1)
    elif len(pts) == 1:
        ImageDraw.Draw(canvas).point(pts, fill=1)
    return np.asarray(canvas, dtype=np.uint8).astype(bool)


def pixel_box(box: Box) -> list[int]:
    """A box as the reference passes it to SAM: four coordinates truncated with ``int`` (x1, y1, x2, y2)."""
    if len(box) != 4:
        raise ValueError(f"a box is [x1, y1, x2, y2] in pixels, got {list(box)!r}")
    return [int(v) for v in box]


def box_mask(box: Box, width: int, height: int) -> np.ndarray:
    """The filled rectangle of a box as a (height, width) bool mask ("box-as-mask"; NOT the paper's gIoU).

    Coordinates are truncated to ints (as the reference does before SAM) and read as pixel corners: the mask covers
    columns ``x1 .. x2-1`` and rows ``y1 .. y2-1`` (area ``(x2-x1)*(y2-y1)``, the box-IoU convention), clipped to the
    image; an inverted or empty box gives an empty mask.
    """
    x1, y1, x2, y2 = pixel_box(box)
    out = np.zeros((int(height), int(width)), dtype=bool)
    x1, x2 = max(x1, 0), min(x2, int(width))
    y1, y2 = max(y1, 0), min(y2, int(height))
    if x2 > x1 and y2 > y1:
        out[y1:y2, x1:x2] = True
    return out


def encode_rle(mask: np.ndarray) -> dict[str, Any]:
    """COCO RLE of a 2-D mask, as the reference stores it: ``{"size": [h, w], "counts": str}`` (JSON-ready)."""
    arr = np.asarray(mask)
    if arr.ndim != 2:
        raise ValueError(f"encode_rle expects a 2-D mask, got shape {arr.shape}")
    rle = mask_utils.encode(np.asfortranarray(arr.astype(np.uint8)))
    counts = rle["counts"]
    return {
        "size": [int(s) for s in rle["size"]],
        "counts": counts.decode("utf-8") if isinstance(counts, bytes) else counts,
    }


def decode_rle(rle: Mapping[str, Any]) -> np.ndarray:
    """The (h, w) bool mask of a COCO RLE (``counts`` as str or bytes)."""
    counts = rle["counts"]
    if isinstance(counts, list):  # uncompressed RLE
        h, w = rle["size"]
        rle = mask_utils.frPyObjects(dict(rle), h, w)
    else:
        rle = {"size": list(rle["size"]), "counts": counts.encode("utf-8") if isinstance(counts, str) else counts}
    with warnings.catch_warnings():  # pycocotools' decode trips numpy 2's __array__(copy=...) DeprecationWarning
        warnings.simplefilter("ignore", DeprecationWarning)
        return mask_utils.decode(rle).astype(bool)


# ------------------------------------------------------------------------------------------------------ GT masks


def _size_hw(size: Sequence[int]) -> tuple[int, int]:
    if len(size) != 2:
        raise ValueError(f"size is (height, width), got {size!r}")
    return int(size[0]), int(size[1])


def _shapes(record: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    shapes = record.get("shapes") or []
    if not shapes:
        raise ValueError("ReasonSeg record has no shapes (the reference skips such images)")
    return list(shapes)


def _strict_label_map(record: Mapping[str, Any], size: Sequence[int]) -> np.ndarray:
    """Official LISA's label map: 0 background, 1 target, 255 ignore (largest polygon painted first)."""
    h, w = _size_hw(size)
    polys = [s for s in _shapes(record) if str(s.get("label", "")).lower() != "flag"]
    masks = [polygon_mask(s["points"], w, h) for s in polys]
    order = list(np.argsort([int(m.sum()) for m in masks])[::-1])  # LISA: np.argsort(area_list)[::-1]
    out = np.zeros((h, w), dtype=np.uint8)
    for i in order:
        out[masks[i]] = 255 if "ignore" in str(polys[i].get("label", "")).lower() else 1
    return out


def gt_mask(
    record: Mapping[str, Any], size: Sequence[int], protocol: Literal["paper", "strict"] = "paper"
) -> np.ndarray:
    """The (height, width) bool GT mask of a ReasonSeg JSON record (``size`` = (height, width), as pycocotools).

    ``protocol="paper"``: the reference's ``shapes[0]["points"]`` only, whatever its label.
    ``protocol="strict"``: official LISA -- the union of every polygon not labelled "flag", where a polygon whose
    label contains "ignore" removes its pixels (painted largest first, so a smaller target inside an ignore region
    stays target). Pass :func:`ignore_mask` to :func:`mask_iou` to leave those pixels out of both masks.
    """
    h, w = _size_hw(size)
    if protocol == "paper":
        return polygon_mask(_shapes(record)[0]["points"], w, h)
    if protocol == "strict":
        return _strict_label_map(record, size) == 1
    raise ValueError(f"protocol must be 'paper' or 'strict', got {protocol!r}")


def ignore_mask(
    record: Mapping[str, Any], size: Sequence[int], protocol: Literal["paper", "strict"] = "strict"
) -> np.ndarray:
    """The pixels the strict protocol leaves out of the IoU ("ignore" polygons); all False for ``"paper"``."""
    if protocol == "paper":
        return np.zeros(_size_hw(size), dtype=bool)
    if protocol == "strict":
        return _strict_label_map(record, size) == 255
    raise ValueError(f"protocol must be 'paper' or 'strict', got {protocol!r}")


# ----------------------------------------------------------------------------------------------------------- IoU


def mask_iou(pred: np.ndarray, gt: np.ndarray, ignore: np.ndarray | None = None) -> tuple[int, int, float]:
    """``(I, U, I / (U + 1e-6))`` of two same-shape masks; ``ignore`` pixels are removed from both first.

    >>> a = np.zeros((8, 8), bool); a[0:4, 0:4] = True
    >>> b = np.zeros((8, 8), bool); b[2:6, 2:6] = True
    >>> i, u, iou = mask_iou(a, b); (i, u, round(iou, 4))
    (4, 28, 0.1429)
    """
    p, g = np.asarray(pred, dtype=bool), np.asarray(gt, dtype=bool)
    if p.shape != g.shape:
        raise ValueError(
            f"predicted mask {p.shape} and GT mask {g.shape} differ in size (the reference skips such "
            "images; here it is an error: the mask must be predicted on the image the GT belongs to)"
        )
    if ignore is not None:
        keep = ~np.asarray(ignore, dtype=bool)
        if keep.shape != g.shape:
            raise ValueError(f"ignore mask {keep.shape} and GT mask {g.shape} differ in size")
        p, g = p & keep, g & keep
    inter = int(np.logical_and(p, g).sum())
    union = int(np.logical_or(p, g).sum())
    return inter, union, inter / (union + EPS)


def aggregate_mask_ious(pairs: Iterable[tuple[float, float]]) -> dict[str, float]:
    """``{"giou", "ciou", "n"}`` from per-image ``(I, U)`` pairs (0.0 for both when there are none).

    gIoU = mean_i I_i / (U_i + 1e-6);  cIoU = sum_i I_i / (sum_i U_i + 1e-6).

    >>> m = aggregate_mask_ious([(4, 28), (10, 10)]); round(m["giou"], 4), round(m["ciou"], 4)
    (0.5714, 0.3684)
    """
    pairs = [(float(i), float(u)) for i, u in pairs]
    if not pairs:
        return {"giou": 0.0, "ciou": 0.0, "n": 0}
    giou = float(np.mean([i / (u + EPS) for i, u in pairs]))
    ciou = sum(i for i, _ in pairs) / (sum(u for _, u in pairs) + EPS)
    return {"giou": giou, "ciou": float(ciou), "n": len(pairs)}


# ----------------------------------------------------------------------------------------------------------- SAM


def _missing_checkpoint(checkpoint: str, why: str) -> str:
    return (
        f"SAM checkpoint {checkpoint!r} {why}. gIoU needs a transformers-format SAM checkpoint (config.json, "
        f"model.safetensors, preprocessor_config.json); nothing is downloaded here. On a machine with internet run "
        f"`hf download {SAM_HUB_ID} --local-dir DIR` (or `huggingface-cli download {SAM_HUB_ID} --local-dir DIR`; "
        f"{SAM_HUB_ID} is the Hugging Face port of the reference's sam_vit_h_4b8939.pth, which is not loadable "
        f"as is), copy DIR to this machine and pass its path. Without SAM, the 'box-as-mask' fallback scores the "
        f"filled box instead (not the paper's gIoU)."
    )


class SamMasker:
    """Box prompt -> one SAM mask per image (``multimask_output=False``), at the original image size.

    ``checkpoint`` is a local directory in transformers format (see the module docstring for how to get
    ``facebook/sam-vit-huge`` offline) or a hub id already in the local Hugging Face cache; nothing is downloaded.
    """

    def __init__(self, checkpoint: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import SamModel, SamProcessor  # lazily: the pure functions above do not need transformers

        name = str(checkpoint)
        path = Path(name).expanduser()
        if path.exists():
            if not path.is_dir():
                raise OSError(_missing_checkpoint(name, "is a file, not a directory"))
            source, kwargs = str(path), {}
        elif _HUB_ID.match(name) and not name.startswith("."):
            source, kwargs = name, {"local_files_only": True}
        else:
            raise FileNotFoundError(_missing_checkpoint(name, "does not exist"))
        try:
            self.model = SamModel.from_pretrained(source, dtype=dtype, trust_remote_code=False, **kwargs)
            self.processor = SamProcessor.from_pretrained(source, trust_remote_code=False, **kwargs)
        except (OSError, ValueError) as err:
            raise OSError(_missing_checkpoint(name, f"could not be loaded ({type(err).__name__}: {err})")) from err
        self.device = torch.device(device)
        self.dtype = dtype
        self.model.to(self.device).eval()

    def masks(
        self, images: Sequence[Image.Image], boxes: Sequence[Box | None], batch_size: int = 8
    ) -> list[np.ndarray]:
        """One (height, width) bool mask per image; a ``None`` box gives an all-False mask without running SAM.

        Boxes are (x1, y1, x2, y2) in pixels of the original image, truncated to ints as the reference does.
        """
        if len(images) != len(boxes):
            raise ValueError(f"{len(images)} images but {len(boxes)} boxes")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        out: list[np.ndarray | None] = [None] * len(images)
        todo = []
        for k, (image, box) in enumerate(zip(images, boxes)):
            if box is None:
                out[k] = np.zeros((image.height, image.width), dtype=bool)
            else:
                todo.append((k, image.convert("RGB"), pixel_box(box)))
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            inputs = self.processor(
                images=[im for _, im, _ in chunk], input_boxes=[[b] for _, _, b in chunk], return_tensors="pt"
            )
            with torch.inference_mode():
                result = self.model(
                    pixel_values=inputs["pixel_values"].to(self.device, self.dtype),
                    input_boxes=inputs["input_boxes"].to(self.device, self.dtype),
                    multimask_output=False,
                )
            masks = self.processor.post_process_masks(
                result.pred_masks.float().cpu(), inputs["original_sizes"], inputs["reshaped_input_sizes"]
            )
            for (k, image, _), m in zip(chunk, masks):
                mask = m[0, 0].numpy().astype(bool)  # (boxes=1, masks=1, H, W)
                if mask.shape != (image.height, image.width):  # would be a processor bug; never silently skipped
                    raise ValueError(f"SAM mask {mask.shape} != image {(image.height, image.width)}")
                out[k] = mask
        assert all(m is not None for m in out)
        return out  # type: ignore[return-value]


class _Masker(Protocol):
    def masks(self, images: Sequence[Image.Image], boxes: Sequence[Box | None]) -> list[np.ndarray]: ...


def _box_as_mask(images: Sequence[Image.Image], boxes: Sequence[Box | None]) -> list[np.ndarray]:
    return [
        np.zeros((im.height, im.width), dtype=bool) if b is None else box_mask(b, im.width, im.height)
        for im, b in zip(images, boxes)
    ]


def evaluate_masks(
    masker: _Masker | Literal["box-as-mask"],
    images: Sequence[Image.Image],
    pred_boxes: Sequence[Box | None],
    gt_masks: Sequence[np.ndarray],
    ignore_masks: Sequence[np.ndarray | None] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Masks from the predicted boxes, scored against the GT masks: ``(metrics, per_sample)``.

    ``masker`` is a :class:`SamMasker` (the paper's gIoU), any object with the same ``masks(images, boxes)``, or
    ``"box-as-mask"`` (the filled box; a fallback, NOT the paper's gIoU). ``pred_boxes[i]`` is None when no box could
    be parsed (an all-False mask, IoU 0). ``gt_masks[i]`` must be (height, width) of ``images[i]``, else ValueError.
    ``ignore_masks`` (strict protocol, :func:`ignore_mask`) removes pixels from both masks. ``metrics`` is
    :func:`aggregate_mask_ious`'s; ``per_sample[i]`` is ``{"iou", "intersection", "union", "rle"}`` with the predicted
    mask as COCO RLE.
    """
    n = len(images)
    if not (len(pred_boxes) == len(gt_masks) == n) or (ignore_masks is not None and len(ignore_masks) != n):
        raise ValueError(
            f"lengths differ: {n} images, {len(pred_boxes)} boxes, {len(gt_masks)} GT masks"
            + ("" if ignore_masks is None else f", {len(ignore_masks)} ignore masks")
        )
    for k, (image, gt) in enumerate(zip(images, gt_masks)):
        if np.shape(gt) != (image.height, image.width):
            raise ValueError(
                f"sample {k}: GT mask {np.shape(gt)} != image (height, width) {(image.height, image.width)}"
            )
    if isinstance(masker, str):
        if masker != "box-as-mask":
            raise ValueError(f"masker must be a SamMasker or 'box-as-mask', got {masker!r}")
        preds = _box_as_mask(images, pred_boxes)
    else:
        preds = masker.masks(images, pred_boxes)
    if len(preds) != n:
        raise ValueError(f"the masker returned {len(preds)} masks for {n} images")
    per_sample = []
    for k, (pred, gt) in enumerate(zip(preds, gt_masks)):
        if np.shape(pred) != np.shape(gt):
            raise ValueError(
                f"sample {k}: predicted mask {np.shape(pred)} != GT mask {np.shape(gt)} (the reference "
                "skips such images; here it is an error)"
            )
        inter, union, iou = mask_iou(pred, gt, None if ignore_masks is None else ignore_masks[k])
        per_sample.append({"iou": iou, "intersection": inter, "union": union, "rle": encode_rle(pred)})
    metrics = aggregate_mask_ious((s["intersection"], s["union"]) for s in per_sample)
    return metrics, per_sample
