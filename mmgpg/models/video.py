"""Video parts of the Qwen-VL policy: a file's frames sampled and decoded (PyAV), or a list of frames, resized like
images within a per-video pixel budget and paired for the vision tower (:func:`video_part`, :func:`load_video`,
:func:`read_video`, :func:`frame_max_pixels`).

Memory stays bounded by the frame budget, not by the video: a file's frames are counted from its container (or its
packets, without decoding), and only the sampled ones are converted and kept while it is decoded once in order.
"""

from __future__ import annotations

import os

import torch


def load_video(part: dict, patch_size: int) -> tuple[torch.Tensor, dict]:
    """One video part (after :func:`video_part`) as ``(frames [T, 3, H, W] float, metadata)``: a file's frames
    sampled by :func:`read_video`, or a list of frames (PIL images or image paths); each frame resized like an image
    (qwen-vl-utils' ``smart_resize`` to multiples of 2 x the patch, within the part's pixel bounds and its video's
    pixel budget, :func:`frame_max_pixels`; every frame to the first one's size) and the frames padded to an even
    count with the last one (Qwen-VL encodes frames in pairs).
    The metadata (the frames' rate and indices) gives Qwen3-VL's timestamps and Qwen2.5-VL's temporal positions.

    Frame lists are loaded here, not by qwen-vl-utils: its frame-list path passes the merge factor where its image
    loader expects the patch size, which resizes frames to twice the multiple."""
    import numpy as np
    from qwen_vl_utils import smart_resize

    source = part["video"]
    if isinstance(source, str):
        images, metadata = read_video(source, float(part["fps"]), int(part["max_frames"]))
    else:
        from qwen_vl_utils import fetch_image

        images = [fetch_image({"image": f, "min_pixels": part["min_pixels"], "max_pixels": part["max_pixels"]},
                              image_patch_size=patch_size) for f in source]
        metadata = {"fps": float(part["sample_fps"]), "frames_indices": list(range(len(images))),
                    "total_num_frames": len(images)}
    frames = len(images) + len(images) % 2  # padded to pairs below
    max_pixels = frame_max_pixels(frames, part["min_pixels"], part["max_pixels"], part.get("total_pixels") or 0,
                                  patch_size)
    height, width = smart_resize(images[0].height, images[0].width, factor=2 * patch_size,
                                 min_pixels=part["min_pixels"], max_pixels=max_pixels)
    images = [im.convert("RGB").resize((width, height)) for im in images]
    if len(images) % 2:
        images.append(images[-1])
        metadata["frames_indices"] = [*metadata["frames_indices"], metadata["frames_indices"][-1]]
    video = torch.stack([torch.from_numpy(np.asarray(im).transpose(2, 0, 1).copy()) for im in images]).float()
    return video, metadata


def default_total_pixels(patch_size: int) -> int:
    """qwen-vl-utils' pixel budget of one video when none is given: 128,000 tokens' worth x 0.9, a token being a
    (2 x patch)^2-pixel cell (its ``MODEL_SEQ_LEN`` default; 90,316,800 pixels for Qwen2.5-VL's 14-pixel patch).

    >>> default_total_pixels(14), default_total_pixels(16)
    (90316800, 117964800)
    """
    return int(128000 * (2 * patch_size) ** 2 * 0.9)


def frame_max_pixels(frames: int, min_pixels: int, max_pixels: int, total_pixels: int, patch_size: int) -> float:
    """The most pixels one frame of a ``frames``-frame video may keep: qwen-vl-utils' budget rule (``fetch_video``),

        min(max_pixels, max(total_pixels / frames x 2, 1.05 x min_pixels))

    — the video's ``total_pixels`` shared by its frame pairs (2 frames are one temporal patch), never below just over
    ``min_pixels`` and never above the per-frame ``max_pixels``. ``total_pixels`` 0 means qwen-vl-utils' default
    (:func:`default_total_pixels`), which caps no frame below a usual ``max_pixels`` until the hundreds of frames.
    (qwen-vl-utils also caps a frame at 768 tokens' worth; mmgpg's ``model.max_pixels`` is that cap here.)

    Worked numbers: 16 frames with a 4,816,896-pixel budget (6,144 tokens of 28 x 28) may keep
    4,816,896 / 16 x 2 = 602,112 pixels each, below max_pixels 1,003,520; with 3,136 / 200,704 bounds the
    200,704 cap wins; a 100,000-pixel budget would give 12,500, so the floor 1.05 x 50,176 = 52,684 wins.

    >>> frame_max_pixels(16, 3136, 1003520, 4816896, 14), frame_max_pixels(16, 3136, 200704, 4816896, 14)
    (602112.0, 200704)
    >>> frame_max_pixels(16, 50176, 1003520, 100000, 14), frame_max_pixels(16, 3136, 1003520, 0, 14)
    (52684, 1003520)

    Not rounded: qwen-vl-utils hands the same unrounded bound to ``smart_resize``. (transformers' Qwen video
    processors apply the same rule under ``cap_pixels_per_frame``; mmgpg resizes the frames itself and switches
    theirs off.)
    """
    total = total_pixels or default_total_pixels(patch_size)
    return min(max_pixels, max(total / frames * 2, int(min_pixels * 1.05)))


def read_video(path: str, fps: float, max_frames: int) -> tuple[list, dict]:
    """The frames of a video file sampled at ``fps`` frames per second (at most ``max_frames``, at least 2, evenly
    spaced over the whole video, as qwen-vl-utils samples), decoded with PyAV, and their metadata.

    Written here because none of qwen-vl-utils' readers works with the torchvision mmgpg installs (0.29 removed
    ``torchvision.io.read_video``; decord and torchcodec are extra native installs); PyAV is already a dependency
    of qwen-vl-utils. Remote videos are not read (download them first)."""
    import av

    if "://" in path and not path.startswith("file://"):
        raise ValueError(f"video {path!r}: mmgpg reads local video files only; download it and give the path")
    local = path[7:] if path.startswith("file://") else path
    if not os.path.isfile(local):
        raise FileNotFoundError(f"video file {local!r} does not exist")
    try:
        with av.open(local) as container:
            if not container.streams.video:
                raise ValueError("it has no video stream")
            stream = container.streams.video[0]
            rate = float(stream.average_rate or stream.guessed_rate or 0) or 24.0
            # the frame count from the container, else from its packets (no decoding): only the sampled frames are
            # converted and kept, so memory is bounded by max_frames, not by the video's length
            total = int(stream.frames or 0) or sum(1 for packet in container.demux(stream) if packet.size)
            if not total:
                raise ValueError("it has no frames")
            container.seek(0)
            indices = _sampled(total, rate, fps, max_frames)
            frames, decoded = _decode_indices(container, stream, indices)
            if decoded < total and len(frames) < len(indices):  # fewer frames than the container said: sample those
                container.seek(0)
                total, indices = decoded, _sampled(decoded, rate, fps, max_frames)
                frames, _ = _decode_indices(container, stream, indices)
    except (av.error.FFmpegError, ValueError, OSError) as err:
        raise ValueError(f"could not read video {local!r}: {err}") from None
    if not frames:
        raise ValueError(f"video {local!r} has no frames")
    return frames, {"fps": rate, "frames_indices": indices, "total_num_frames": total}


def _sampled(total: int, rate: float, fps: float, max_frames: int) -> list[int]:
    """Indices of ``total`` frames at ``rate`` sampled at ``fps`` (at least 2, at most ``max_frames``, evenly spaced
    over the whole video; qwen-vl-utils' rule).

    >>> _sampled(16, 8.0, 2.0, 16), _sampled(1, 8.0, 2.0, 16)
    ([0, 5, 10, 15], [0])
    """
    import numpy as np

    wanted = int(min(max(round(total / rate * fps), 2), max_frames, total))
    return np.linspace(0, total - 1, max(wanted, 1)).round().astype(int).tolist()


def _decode_indices(container, stream, indices: list[int]) -> tuple[list, int]:
    """The frames at ``indices`` (as PIL images, in order) of a sequential decode, and how many frames it decoded."""
    want, out, count, last = set(indices), {}, 0, max(indices)
    for frame in container.decode(stream):
        if count in want:
            out[count] = frame.to_image()
        count += 1
        if count > last:
            break
    return [out[i] for i in indices if i in out], count


def video_part(part: dict, fps: float, max_frames: int, min_pixels: int, max_pixels: int,
               total_pixels: int = 0) -> dict:
    """A video content part with the policy's defaults, in qwen-vl-utils' keys: a file or URL is sampled at ``fps``
    frames per second (the part's own ``fps`` first), at most ``max_frames`` frames; a list of frames keeps its frames
    (the part's ``fps``, default ``fps``, is the rate they were taken at: it sets Qwen3-VL's timestamps and
    Qwen2.5-VL's temporal positions) and is subsampled evenly when it holds more than ``max_frames``; every frame is
    resized within ``min_pixels`` .. ``max_pixels`` like an image, and within the video's ``total_pixels`` budget
    (the part's own first; 0: qwen-vl-utils' default; :func:`frame_max_pixels`).

    >>> video_part({"type": "video", "video": list(range(10))}, 2.0, 4, 64, 256)["video"]
    [0, 3, 6, 9]
    """
    part = {"min_pixels": min_pixels, "max_pixels": max_pixels, **part}
    if total_pixels and "total_pixels" not in part:
        part["total_pixels"] = total_pixels
    if int(part.get("total_pixels") or 0) < 0:
        raise ValueError(f"a video part's total_pixels is a pixel budget >= 0 (0: qwen-vl-utils' default); got "
                         f"{part['total_pixels']!r}")
    frames = part.get("video")
    limit = int(part.pop("max_frames", max_frames))
    if isinstance(frames, (list, tuple)):
        if not frames:
            raise ValueError("a video part holds an empty list of frames")
        if len(frames) > limit:
            frames = [frames[round(i * (len(frames) - 1) / (limit - 1))] for i in range(limit)] if limit > 1 \
                else [frames[0]]
        part["video"] = list(frames)
        part["sample_fps"] = float(part.pop("fps", fps))
    elif isinstance(frames, str):
        part.setdefault("fps", fps)
        part["max_frames"] = limit
    else:
        raise ValueError(f"a video part's 'video' is a file path, a URL or a list of frames; got {type(frames).__name__}")
    return part
