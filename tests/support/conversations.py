"""Chat conversations the model tests share."""

from __future__ import annotations


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
