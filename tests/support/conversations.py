"""Chat conversations the model tests share."""

from __future__ import annotations


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
