"""Loading task data from the Hugging Face hub or from local files in the same schema, with errors that say what to
download and where to put it.

``source`` is a hub dataset id (``leonardPKU/GEOQA_R1V_Train_8K``) or a local path: a ``.jsonl``/``.json``/
``.parquet`` file, a directory saved with ``datasets.save_to_disk``, or a directory of such files (loaded with
``datasets.load_dataset(dir)``). Images may be PIL images, ``{"bytes": ..., "path": ...}`` dicts (the hub's Image
feature) or paths, absolute or relative to an image root.
"""

from __future__ import annotations

import io
import json
from importlib import resources
from pathlib import Path
from typing import Any


class DataNotFound(FileNotFoundError):
    """Task data that is not here; the message says what to download and where to put it."""


class DataError(ValueError):
    """A data row or image that cannot be used; the message names the file, the row or id and the field."""


class Records(list):
    """Rows read from a file, remembering the file (``source``) and each row's line (``lines``) for messages."""

    source: str = ""
    lines: list[int] | None = None


class BadRow:
    """A line of a data file that could not be parsed: the error is raised when the row is used, so one bad line
    fails (or, with ``data.on_bad_row=skip``, skips) that row only."""

    def __init__(self, reason: str):
        self.reason = reason


MAX_ASPECT_RATIO = 200
"""Qwen2-VL's image resizing (``smart_resize``) refuses a longer-to-shorter side ratio above 200."""


def shipped(relative: str) -> Path:
    """A data file shipped inside the ``mmgpg_tasks`` package (``tasks/data/`` in the repository)."""
    return Path(str(resources.files("mmgpg_tasks") / "data" / relative))


def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a JSONL data file with their line numbers; a line that is not strict JSON becomes a
    :class:`BadRow` (an error naming file:line when that row is used)."""
    from mmgpg.jsonl import read_jsonl as read

    got = read(path, strict=True, on_error="skip")
    entries = sorted([*zip(got.lines, got.rows), *((n, BadRow(reason)) for n, reason in got.skipped)],
                     key=lambda pair: pair[0])
    rows = Records(row for _, row in entries)
    rows.source, rows.lines = str(path), [n for n, _ in entries]
    return rows


def load_records(source: str, *, split: str, what: str, how_to_get: str, revision: str | None = None) -> list[dict] | Any:
    """Rows of ``source`` (a list of dicts, or a ``datasets.Dataset`` for hub/parquet data, indexable like a list).

    ``what`` names the data in errors ("GEOQA training data"); ``how_to_get`` says how to obtain it offline.
    """
    if not source:
        raise DataNotFound(f"No {what} configured. {how_to_get}")
    path = Path(source).expanduser()
    if path.exists():
        if path.is_file():
            if path.suffix == ".jsonl":
                return read_jsonl(path)
            if path.suffix == ".json":
                try:
                    data = json.loads(path.read_text(encoding="utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError) as err:
                    raise DataError(f"{path}: not a readable JSON file ({err})") from None
                if isinstance(data, dict):
                    for key in ("data", "rows", "results", split):
                        if isinstance(data.get(key), list):
                            data = data[key]
                            break
                if not isinstance(data, list):
                    raise DataError(f"{path}: expected a JSON list of records")
                rows = Records(data)
                rows.source = str(path)
                return rows
            if path.suffix == ".parquet":
                import datasets

                return datasets.load_dataset("parquet", data_files=str(path), split="train")
            raise ValueError(f"{path}: unsupported file type {path.suffix!r} (use .jsonl, .json or .parquet)")
        import datasets

        if (path / "dataset_info.json").exists() or (path / "state.json").exists():
            loaded = datasets.load_from_disk(str(path))
            return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        return datasets.load_dataset(str(path), split=split)
    looks_local = source.startswith((".", "/", "~")) or source.endswith((".json", ".jsonl", ".parquet")) or source.count("/") != 1
    if looks_local:
        raise DataNotFound(f"{what}: {source!r} does not exist. {how_to_get}")
    import datasets

    try:
        return datasets.load_dataset(source, split=split, revision=revision)
    except Exception as err:  # offline, unknown id, no such split: the hub's own message plus ours
        raise DataNotFound(
            f"Could not load {what} {source!r} (split {split!r}) from the Hugging Face hub: {type(err).__name__}: "
            f"{str(err)[:300]}. {how_to_get}"
        ) from err


def open_image(value: Any, root: str | Path | None = None, *, what: str = "image", how_to_get: str = ""):
    """A PIL RGB image from a PIL image, a hub Image-feature dict, bytes, or a path (relative paths are taken
    relative to ``root``). Decoded fully here, so a damaged file fails now with its path, never later in a batch;
    converted to RGB faithfully (:func:`to_rgb`); refused when it is a decompression bomb or too elongated."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return checked_rgb(value, what)
    if isinstance(value, dict):
        if value.get("bytes"):
            return _decode(lambda: Image.open(io.BytesIO(value["bytes"])), f"{what} (embedded bytes)")
        value = value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return _decode(lambda: Image.open(io.BytesIO(value)), f"{what} (embedded bytes)")
    if not value:
        raise DataNotFound(f"{what}: the record has no image. {how_to_get}")
    if not isinstance(value, (str, Path)):
        raise DataError(f"{what}: the image field must be a path, bytes or an image; got {type(value).__name__}")
    path = Path(str(value)).expanduser()
    if not path.is_absolute() and root:
        path = Path(root).expanduser() / path
    if not path.exists():
        raise DataNotFound(f"{what}: image {str(path)!r} does not exist. {how_to_get}")
    if path.is_dir():
        raise DataError(f"{what}: image {str(path)!r} is a directory, not an image file")
    return _decode(lambda: Image.open(path), f"{what} {str(path)!r}")


def _decode(opener, label: str):
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = opener()
            image.load()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise DataError(f"{label}: refused as a decompression bomb ({err}); resize the image") from None
    except UnidentifiedImageError:
        raise DataError(f"{label}: not an image file PIL can read") from None
    except (OSError, SyntaxError, ValueError) as err:  # truncated or corrupt data
        raise DataError(f"{label}: damaged image ({err})") from None
    return checked_rgb(image, label)


def checked_rgb(image, label: str):
    """:func:`to_rgb` after checking the size: both sides >= 1 pixel and an aspect ratio Qwen2-VL accepts."""
    w, h = image.size
    if w < 1 or h < 1:
        raise DataError(f"{label}: empty image ({w}x{h})")
    if max(w, h) / min(w, h) > MAX_ASPECT_RATIO:
        raise DataError(f"{label}: {w}x{h} pixels has an aspect ratio above {MAX_ASPECT_RATIO}:1, which Qwen2-VL cannot "
                        "encode; crop or pad it")
    return to_rgb(image)


def to_rgb(image):
    """RGB without losing the picture: 16/32-bit greyscale scaled to 8 bits (PIL's ``convert`` clips it to white),
    transparency composited on white (``convert`` would expose whatever colour hides under alpha 0)."""
    from PIL import Image

    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        import numpy as np

        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") or values.max(initial=0) > 255 else 255.0
        image = Image.fromarray(np.clip(np.round(values * (255.0 / top)), 0, 255).astype(np.uint8), mode="L")
    elif image.mode == "F":
        import numpy as np

        values = np.nan_to_num(np.asarray(image, dtype=np.float64))
        scale = 255.0 if values.max(initial=0) <= 1.0 else 1.0
        image = Image.fromarray(np.clip(np.round(values * scale), 0, 255).astype(np.uint8), mode="L")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")
