"""Chat conversations the model tests share."""

from __future__ import annotations

from pathlib import Path


def mixed_image_conversations():
    """Three prompts of different lengths: two images of different sizes, one image of a third size, no image."""
    from PIL import Image, ImageDraw

    wide = Image.new("RGB", (112, 56), (30, 160, 90))
    ImageDraw.Draw(wide).ellipse((60, 10, 100, 50), fill=(250, 250, 20))
    big, small = (part[0]["content"][0]["image"] for part in two_image_conversations())
    return [
        [{"role": "user", "content": [{"type": "image", "image": big}, {"type": "image", "image": wide},
                                      {"type": "text", "text": "Which picture has more shapes?"}]}],
        [{"role": "user", "content": [{"type": "image", "image": small}, {"type": "text", "text": "What colour?"}]}],
        [{"role": "user", "content": [{"type": "text", "text": "How many sides has a square?"}]}],
    ]


def two_image_conversations():
    """Two prompts whose images have different sizes (112x112 -> 16 visual tokens, 56x112 -> 8)."""
    from PIL import Image, ImageDraw

    big = Image.new("RGB", (112, 112), (123, 117, 104))
    ImageDraw.Draw(big).ellipse((20, 20, 50, 50), fill=(220, 40, 40))
    small = Image.new("RGB", (56, 112), (123, 117, 104))
    ImageDraw.Draw(small).rectangle((10, 60, 40, 90), fill=(40, 80, 220))
    return [
        [{"role": "user", "content": [{"type": "image", "image": big}, {"type": "text", "text": "How many shapes?"}]}],
        [{"role": "user", "content": [{"type": "image", "image": small}, {"type": "text", "text": "What colour?"}]}],
    ]


def moving_dot_frames(n: int, size: tuple[int, int] = (64, 64), step: int = 6):
    """``n`` frames of a red dot moving right across a grey background (each frame differs)."""
    from PIL import Image, ImageDraw

    frames = []
    for t in range(n):
        frame = Image.new("RGB", size, (120, 120, 120))
        x = 4 + step * t
        ImageDraw.Draw(frame).ellipse((x, 20, x + 12, 32), fill=(220, 30, 30))
        frames.append(frame)
    return frames


def mixed_video_conversations():
    """Three prompts of different lengths: a video of 4 frames; an image and a video of 6 frames of another size
    (different frame counts and grids in one batch); text only."""
    image = two_image_conversations()[1][0]["content"][0]["image"]
    return [
        [{"role": "user", "content": [{"type": "video", "video": moving_dot_frames(4)},
                                      {"type": "text", "text": "Which way does the dot move?"}]}],
        [{"role": "user", "content": [{"type": "image", "image": image},
                                      {"type": "video", "video": moving_dot_frames(6, (96, 64), 9), "fps": 1.0},
                                      {"type": "text", "text": "Is the dot in the picture?"}]}],
        [{"role": "user", "content": [{"type": "text", "text": "How many sides has a square?"}]}],
    ]


def write_video(path: Path, frames: list, fps: int) -> None:
    """An H.264 file of ``frames`` (PIL) at ``fps``, written with PyAV."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames[0].width, frames[0].height, "yuv420p"
        for frame in frames:
            out.mux(stream.encode(av.VideoFrame.from_image(frame)))
        out.mux(stream.encode())
