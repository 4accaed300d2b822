"""``shapes_zoom``: name the colour of a small mark that the full view cannot resolve — an embedded, offline task
whose episodes need the ``zoom`` tool.

Each image is ``size`` x ``size`` pixels (448) on the CLIP mean background (123, 117, 104, as ``shapes``), with one
small square mark (``mark`` pixels, 12) near the centre of each quarter, in a random colour of red, green, blue and
yellow (colours may repeat; each mark is jittered by up to ``jitter`` pixels). The question names a quarter: "What
colour is the mark in the top-left quarter?".

Why the tool is needed: the tiny model's image budget (``model.max_pixels`` = 112 x 112) shows the whole image at a
quarter of its size, where a 12-pixel mark covers about 1 % of one visual token (28 x 28 pixels after the merge); a
``zoom`` into the 125 x 125 (of 1000) box around the mark's quarter centre crops 56 x 56 pixels, enlarged to 112 x 112
(:data:`mmgpg.tools.image.MIN_SIDE`), where the mark covers most of a token. Without a zoom the answer is a guess
(chance 25 %).

Gold episode (SFT warm start, :meth:`ShapesZoomTask.gold_completion`): turn 1 zooms into the quarter's box, turn 2
answers::

    <tool_call>{"name": "zoom", "arguments": {"bbox_2d": [188, 188, 312, 312]}}</tool_call>
    <answer>red</answer>

Rewards: ``accuracy`` (the episode ends with its ``<answer>``, and the last one is the colour). Metric ``useful_zoom``: the episode made
a zoom whose box holds the asked mark and covers at most a sixteenth of the image (enough enlargement to show it).
Items are a pure function of ``(seed, split, index)``.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import ClassVar

from mmgpg_tasks.shapes import BACKGROUND
from PIL import Image, ImageDraw

from mmgpg.rollout.episode import EpisodeLimits
from mmgpg.task import Example, GeneratedTask
from mmgpg.tools import TOOL_CALL, parse_tool_call

MARK_COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 80, 220), "yellow": (230, 210, 40)}
QUARTERS = {"top-left": (0, 0), "top-right": (1, 0), "bottom-left": (0, 1), "bottom-right": (1, 1)}
QUESTION = ("What colour is the small mark in the {quarter} quarter of the image: red, green, blue or yellow? The "
            "image is too small to see it; zoom in first. Give the final answer in <answer> </answer> tags.")
CENTRE = [250, 250, 750, 750]  # a further zoom of the gold episodes: the centre of the last image, where the mark is
ZOOM_HALF = 62  # half the gold zoom box's side, on the 0-1000 grid (a 125-wide box around the quarter's centre)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def last_answer(text: str) -> str | None:
    """The stripped, lower-cased text of the episode's last ``<answer>…</answer>`` (None: there is none).

    >>> last_answer("<answer>blue</answer> then <answer> Red </answer>")
    'red'
    """
    found = _ANSWER.findall(text)
    return found[-1].strip().lower() if found else None


def episode_accuracy(text: str, colour: str) -> float:
    """1.0 when the episode ends with its answer and its last ``<answer>`` is ``colour`` (a turn that rambles on
    after its answer until ``max_new_tokens`` earns nothing: without that rule RL drifts toward never stopping).

    >>> episode_accuracy("<answer>red</answer>", "red"), episode_accuracy("<answer>red</answer><answ", "red")
    (1.0, 0.0)
    """
    return float(text.rstrip().endswith("</answer>") and last_answer(text) == colour)


def quarter_box(quarter: str) -> list[int]:
    """The gold zoom box (0-1000 grid) around the centre of ``quarter``.

    >>> quarter_box("top-left"), quarter_box("bottom-right")
    ([188, 188, 312, 312], [688, 688, 812, 812])
    """
    col, row = QUARTERS[quarter]
    cx, cy = 250 + 500 * col, 250 + 500 * row
    return [cx - ZOOM_HALF, cy - ZOOM_HALF, cx + ZOOM_HALF, cy + ZOOM_HALF]


def useful_zoom(text: str, mark_box: list[float]) -> float:
    """1.0 when a ``zoom`` call in the episode's ``text`` has a box (0-1000 grid) that holds ``mark_box`` (the asked
    mark, same grid) and covers at most 1/16 of the image.

    >>> call = '<tool_call>{"name": "zoom", "arguments": {"bbox_2d": [188, 188, 312, 312]}}</tool_call>'
    >>> useful_zoom(call, [230, 230, 260, 260]), useful_zoom(call, [400, 400, 420, 420])
    (1.0, 0.0)
    """
    for found in TOOL_CALL.finditer(text):
        try:
            call = parse_tool_call(found.group(0))
        except ValueError:
            continue
        box = call.arguments.get("bbox_2d") if call is not None and call.name == "zoom" else None
        if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)):
            continue
        x1, y1, x2, y2 = box
        holds = x1 <= mark_box[0] and y1 <= mark_box[1] and x2 >= mark_box[2] and y2 >= mark_box[3]
        if holds and (x2 - x1) * (y2 - y1) <= 1000 * 1000 / 16:
            return 1.0
    return 0.0


@dataclass
class ShapesZoomTask(GeneratedTask):
    """The colour of a small mark in a named quarter of a large image; the ``zoom`` tool shows it (embedded)."""

    name: ClassVar[str] = "shapes_zoom"
    version: ClassVar[str] = "1"
    tools: ClassVar[tuple[str, ...]] = ("zoom",)
    rewards: ClassVar[dict] = {}  # set per instance in __post_init__

    num_train: int = 4000
    """Items in the train split."""
    num_test: int = 200
    """Items in the test split."""
    size: int = 448
    """Image side in pixels."""
    mark: int = 12
    """Mark side in pixels."""
    jitter: int = 8
    """Largest offset of a mark from its quarter's centre, in pixels."""
    max_turns: int = 3
    """Policy turns per episode (a zoom and an answer need 2)."""
    seed: int = 0
    """Data seed; items are a pure function of (seed, split, index)."""
    gold_zoom_share: float = 1.0
    """The share of gold episodes (SFT) that zoom before answering; the rest answer at once, which from the full
    view is a guess. The demo warm-starts with 0.5, so that RL has to find out that zooming pays."""
    gold_zooms: int = 1
    """Zooms in a gold episode: into the quarter, then into the centre of the last image (episodes of
    ``gold_zooms + 1`` turns: bench/tools.py trains models that make 1 and 3)."""
    describe_tools: bool = True
    """Add the zoom tool's block (Qwen's function-calling format) to the system message. The demo leaves it out: the
    tiny models' character-level vocabulary makes it ~600 tokens, and SFT on gold episodes teaches the call."""

    def __post_init__(self):
        half_box = ZOOM_HALF / 1000 * self.size
        if self.mark < 1 or self.jitter < 0 or self.mark / 2 + self.jitter > half_box:
            raise ValueError(f"mark={self.mark} with jitter={self.jitter} leaves the gold zoom box "
                             f"({2 * half_box:.0f} pixels of a {self.size}-pixel image)")
        if not 1 <= self.gold_zooms < self.max_turns:
            raise ValueError(f"gold_zooms must be at least 1 and below max_turns={self.max_turns} (the answer is a "
                             f"turn too); got {self.gold_zooms}")
        if not 0.0 <= self.gold_zoom_share <= 1.0:
            raise ValueError(f"gold_zoom_share is a share in [0, 1]; got {self.gold_zoom_share}")
        if self.size < 64:
            raise ValueError(f"size must be at least 64 pixels; got {self.size}")
        self.episode_limits = EpisodeLimits(max_turns=self.max_turns, max_images=self.max_turns, max_tokens=512)
        self.rewards = {"accuracy": lambda completion, ex: episode_accuracy(completion, ex.answer)}

    def example(self, split: str, index: int) -> Example:
        self.check_item(split, index)
        rng = random.Random(f"{self.seed}:{split}:{index}")
        image = Image.new("RGB", (self.size, self.size), BACKGROUND)
        draw = ImageDraw.Draw(image)
        marks = {}
        for quarter, (col, row) in QUARTERS.items():
            colour = rng.choice(list(MARK_COLOURS))
            cx = self.size / 4 * (1 + 2 * col) + rng.randint(-self.jitter, self.jitter)
            cy = self.size / 4 * (1 + 2 * row) + rng.randint(-self.jitter, self.jitter)
            box = [round(cx - self.mark / 2), round(cy - self.mark / 2), round(cx + self.mark / 2),
                   round(cy + self.mark / 2)]
            draw.rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=MARK_COLOURS[colour])
            marks[quarter] = (colour, [v * 1000 / self.size for v in box])
        quarter = rng.choice(list(QUARTERS))
        return Example(id=f"shapes_zoom-{split}-{index}", media=[image], question=QUESTION.format(quarter=quarter),
                       answer=marks[quarter][0],
                       meta={"quarter": quarter, "mark_box": marks[quarter][1],
                             "colours": {q: c for q, (c, _) in marks.items()}})

    def prompt(self, example: Example) -> list[dict]:
        return [{"role": "user", "content": [{"type": "image", "image": example.media[0]},
                                             {"type": "text", "text": example.question}]}]

    def metrics(self, completion: str, example: Example) -> dict[str, float]:
        return {"useful_zoom": useful_zoom(completion, example.meta["mark_box"])}

    def success(self, completion: str, example: Example, rewards) -> bool:
        return rewards["accuracy"] >= 1.0

    def gold_completion(self, example: Example) -> list[str]:
        """The gold episode's turns: zoom into the asked quarter's box (then ``gold_zooms`` - 1 times into the centre
        of the last image), then answer; or, for the share of examples that ``gold_zoom_share`` leaves out (a pure
        function of the seed and the example), the answer alone."""
        answer = f"<answer>{example.answer}</answer>"
        if random.Random(f"{self.seed}:gold:{example.id}").random() >= self.gold_zoom_share:
            return [answer]
        boxes = [quarter_box(example.meta["quarter"])] + [CENTRE] * (self.gold_zooms - 1)
        calls = [json.dumps({"name": "zoom", "arguments": {"bbox_2d": box}}) for box in boxes]
        return [f"<tool_call>{call}</tool_call>" for call in calls] + [answer]

    def record_fields(self, example: Example) -> dict:
        return {"question": example.question, "ground_truth": example.answer, "quarter": example.meta["quarter"]}
