"""The built-in image tools: ``zoom`` (crop a box of any image seen so far and enlarge it) and ``rotate``.

Boxes are on a 0-1000 grid of the image's width and height (Qwen2-VL's and Qwen3-VL's grounding convention), so a
call does not depend on how large the processor made the image. The crop is enlarged to at least ``MIN_SIDE`` pixels
on its short side (the policy's pixel bounds then resize it like any image).
"""

from __future__ import annotations

from mmgpg.tools import EpisodeState, Observation, Tool, ToolError

MIN_SIDE = 112  # the shorter side of a zoomed crop, in pixels, before the policy's own resize
IMAGE_INDEX = {"type": "integer", "minimum": 0,
               "description": "which image: 0 is the first the conversation showed; each tool result adds one"}


def _image(arguments: dict, state: EpisodeState):
    index = arguments.get("image", len(state.images) - 1)
    if not state.images:
        raise ToolError("the conversation shows no image")
    if index >= len(state.images):
        raise ToolError(f"there is no image {index}: the conversation has shown {len(state.images)} (0 to "
                        f"{len(state.images) - 1})")
    return state.images[index]


def zoom(arguments: dict, state: EpisodeState) -> Observation:
    """Crop ``bbox_2d`` = [x1, y1, x2, y2] (0-1000 of the width and height) of image ``image`` (default: the last
    one) and enlarge it so its shorter side is at least :data:`MIN_SIDE` pixels.

    >>> from PIL import Image
    >>> obs = zoom({"bbox_2d": [0, 0, 500, 250]}, EpisodeState([Image.new("RGB", (200, 100))]))
    >>> obs.images[0].size, obs.error
    ((448, 112), None)
    """
    image = _image(arguments, state)
    x1, y1, x2, y2 = arguments["bbox_2d"]
    if not (x1 < x2 and y1 < y2):
        raise ToolError(f"the box {arguments['bbox_2d']} has no area: give [x1, y1, x2, y2] with x1 < x2 and y1 < y2")
    width, height = image.size
    box = (round(x1 / 1000 * width), round(y1 / 1000 * height), round(x2 / 1000 * width), round(y2 / 1000 * height))
    if box[2] - box[0] < 1 or box[3] - box[1] < 1:
        raise ToolError(f"the box {arguments['bbox_2d']} is less than a pixel of the {width}x{height} image")
    crop = image.crop(box)
    scale = max(1.0, MIN_SIDE / min(crop.size))
    crop = crop.resize((round(crop.width * scale), round(crop.height * scale)))
    return Observation(f"Zoomed into {list(arguments['bbox_2d'])} of image {arguments.get('image', len(state.images) - 1)}.",
                       [crop])


def rotate(arguments: dict, state: EpisodeState) -> Observation:
    """Image ``image`` (default: the last one) rotated counter-clockwise by ``angle`` (90, 180 or 270 degrees)."""
    image = _image(arguments, state)
    return Observation(f"Rotated image {arguments.get('image', len(state.images) - 1)} by {arguments['angle']} "
                       "degrees.", [image.rotate(arguments["angle"], expand=True)])


ZOOM = Tool("zoom", "Zoom into a region of an image to see small details: returns the region enlarged.",
            {"type": "object", "additionalProperties": False, "required": ["bbox_2d"],
             "properties": {"bbox_2d": {"type": "array", "minItems": 4, "maxItems": 4,
                                        "items": {"type": "number", "minimum": 0, "maximum": 1000},
                                        "description": "[x1, y1, x2, y2] on a 0-1000 grid of the image"},
                            "image": IMAGE_INDEX}}, zoom)
ROTATE = Tool("rotate", "Rotate an image counter-clockwise.",
              {"type": "object", "additionalProperties": False, "required": ["angle"],
               "properties": {"angle": {"enum": [90, 180, 270]}, "image": IMAGE_INDEX}}, rotate)
