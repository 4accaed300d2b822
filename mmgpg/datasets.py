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


def shipped(relative: str) -> Path:
    """A data file shipped inside the ``mmgpg_tasks`` package (``tasks/data/`` in the repository)."""
    return Path(str(resources.files("mmgpg_tasks") / "data" / relative))


def read_jsonl(path: str | Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{number}: not a JSON object ({err.msg})") from err
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
                data = json.loads(path.read_text(encoding="utf-8"))
                if isinstance(data, dict):
                    for key in ("data", "rows", "results", split):
                        if isinstance(data.get(key), list):
                            return data[key]
                if not isinstance(data, list):
                    raise ValueError(f"{path}: expected a JSON list of records")
                return data
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
    relative to ``root``)."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, dict):
        if value.get("bytes"):
            return Image.open(io.BytesIO(value["bytes"])).convert("RGB")
        value = value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return Image.open(io.BytesIO(value)).convert("RGB")
    if not value:
        raise DataNotFound(f"{what}: the record has no image. {how_to_get}")
    path = Path(str(value)).expanduser()
    if not path.is_absolute() and root:
        path = Path(root).expanduser() / path
    if not path.exists():
        raise DataNotFound(f"{what}: image {str(path)!r} does not exist. {how_to_get}")
    return Image.open(path).convert("RGB")
