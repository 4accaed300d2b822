"""The reward library: linear re-implementations equal the anchors' regexes; hand-computed scores; math-verify worker."""

from __future__ import annotations

import re
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmgpg.task import mathjudge
from mmgpg.task.rewards import (
    FORMAT_PATTERN,
    answer_or_whole,
    answer_tag,
    box_giou,
    box_iou,
    box_text,
    format_reward,
    paper_box_reward,
    paper_boxes,
    paper_label_match,
    pixels_to_norm1000,
    rescale_box,
    sat_string_reward,
    strict_box_reward,
    strict_boxes,
    strict_choice,
    strict_format_reward,
    strict_label_match,
)

# Strings built from the pieces that matter to the tag rules, so random draws hit the interesting cases.
PIECES = st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "\n", " ", "a", "3", "<", ">", "/", "(A)",
                         "\u00a0", "\u3000", "\u2028", "\x1c", "\u200b"])
TAGGY = st.lists(PIECES, max_size=14).map("".join)


@settings(max_examples=1500, deadline=None)
@given(TAGGY)
def test_format_reward_equals_the_anchor_regex(text):
    assert format_reward(text) == (1.0 if FORMAT_PATTERN.fullmatch(text) else 0.0)
    assert format_reward(text, prefix="<think>") == (1.0 if FORMAT_PATTERN.fullmatch("<think>" + text) else 0.0)


@settings(max_examples=1500, deadline=None)
@given(TAGGY)
def test_answer_tag_equals_the_anchor_regexes(text):
    for dotall in (True, False):
        m = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL if dotall else 0)
        assert answer_tag(text, dotall=dotall) == (m.group(1) if m else None)
    m = re.search(r"<answer>\s*(.*?)\s*</answer>", text)
    assert answer_tag(text, dotall=False, trim=True) == (m.group(1) if m else None)


def test_format_rules_by_hand():
    assert format_reward("<think>a</think>\n<answer>3</answer>") == 1.0
    assert format_reward(" <think>a</think><answer>3</answer>") == 0.0
    assert format_reward("<think>a</think><answer>b</answer><answer>c</answer>") == 1.0
    assert format_reward("a</think><answer>3</answer>", prefix="<think>") == 1.0
    assert strict_format_reward(" <think>a</think>\n<answer>3</answer>\n") == 1.0
    assert strict_format_reward("<think>a</think><answer>b</answer><answer>c</answer>") == 0.0
    assert strict_format_reward("<think>a</think><answer> </answer>") == 0.0
    assert strict_format_reward("<think>a</think>x<answer>3</answer>") == 0.0


def test_answer_extraction_quirks():
    assert answer_tag("<answer>a\nb</answer>", dotall=False) is None
    assert answer_tag("<answer>a\nb</answer><answer>c</answer>", dotall=False) == "c"
    assert answer_tag("<answer>\n B \n</answer>", dotall=False, trim=True) == "B"
    assert answer_or_whole("no tag here ", dotall=False) == "no tag here"


@pytest.mark.parametrize("completion,gold,reward", [
    ("<answer>left</answer>", "left", 1.0),
    ("<answer>Left</answer>", "left", 0.0),  # case-sensitive
    ("<answer>A</answer>", "A", 1.0),
    ("<answer>the answer is (B)</answer>", "B", 1.0),  # the last RAVEN letter
    ("<answer>A B</answer>", "B", 0.0),  # "A " consumes the space, so B is never matched
    ("left", "left", 1.0),  # no tag: the whole completion
])
def test_sat_string_reward(completion, gold, reward):
    assert sat_string_reward(completion, gold) == reward


@pytest.mark.parametrize("answer,correct,read", [
    ("B", True, "B"), ("(b)", True, "B"), ("B. right", True, "B"), ("right", True, "B"), ("Right.", True, "B"),
    ("A", False, "A"), ("B. left", False, ""), ("A or B", False, ""), ("", False, ""), (None, False, ""),
])
def test_strict_choice(answer, correct, read):
    assert strict_choice(answer, ["left", "right"], "(B)") == (correct, read)


def test_label_matching():
    assert paper_label_match("", "pink primrose") == 1.0  # the empty-answer hack
    assert paper_label_match("rose", "pink primrose") == 1.0
    assert paper_label_match("Pink_Primrose", "pink primrose") == 1.0
    assert paper_label_match("tulip", "pink primrose") == 0.0
    assert strict_label_match("", "pink primrose") == 0.0
    assert strict_label_match("rose", "pink primrose") == 0.0
    assert strict_label_match("Pink-Primrose.", "pink primrose") == 1.0
    assert strict_label_match("pink primrose, rose", "pink primrose") == 0.0


def test_box_math_by_hand():
    a, b = (0, 0, 2, 2), (1, 1, 3, 3)
    assert box_iou(a, b) == pytest.approx(1 / 7)
    # enclosing box 3x3 = 9, union 7: GIoU = 1/7 - 2/9
    assert box_giou(a, b) == pytest.approx(1 / 7 - 2 / 9)
    assert box_giou((0, 0, 1, 1), (2, 2, 3, 3)) == pytest.approx(0 - (9 - 2) / 9)
    assert box_iou((0, 0, 0, 0), (0, 0, 0, 0)) == 0.0
    assert pixels_to_norm1000((10, 20, 100, 150), 267, 189) == (37, 105, 374, 793)
    # 200x100 image seen as 196x112: x * 196/200, y * 112/100
    assert rescale_box((20, 10, 100, 60), (200, 100), (196, 112)) == pytest.approx((19.6, 11.2, 98.0, 67.2))
    assert box_text((19.6, 11.2, 98.0, 67.2)) == "(19,11),(98,67)"


@pytest.mark.parametrize("completion,reward", [
    ("<answer>(123,456),(789,999)</answer>", 2.0),
    ("<answer>(120,450),(790,990)</answer>", 1.9669),
    ("<answer>(120, 450), (790, 990)</answer>", 1.9669),
    # two boxes: the anchors score the box from the first top-left (100,100) to the second top-left (300,300):
    # I = 0, U = 0.04 + 0.666*0.543 = 0.401638, C = 0.689*0.899 = 0.619411 -> 1 - (C - U)/C = 0.648419
    ("<answer>(100,100),(500,500) (300,300),(900,900)</answer>", 0.648419),
    ("<answer>[120,450,790,990]</answer>", 0.0),
])
def test_paper_box_reward_probes(completion, reward):
    """The docs/anchors.md §5.3 probes (GT ``(123,456),(789,999)``), and the multi-box quirk computed by hand."""
    assert paper_box_reward(completion, "(123,456),(789,999)") == pytest.approx(reward, abs=1e-4)


def test_boxes_parsing():
    assert paper_boxes("x (1,2),(3,4) y ( 5 , 6 ),( 7 , 8 )") == [(1, 2, 3, 4), (5, 6, 7, 8)]
    assert paper_boxes("(1" + "0" * 30 + ",2),(3,4)") == []  # a number too long to be a coordinate
    assert strict_boxes("[1.5, 2, 3, 4] then (5,6),(7,8)") == [(1.5, 2.0, 3.0, 4.0), (5.0, 6.0, 7.0, 8.0)]
    assert strict_box_reward("<think/><answer>[0,0,2,2]</answer>", (0, 0, 2, 2)) == 2.0
    assert strict_box_reward("<answer>[2,2,0,0]</answer>", (0, 0, 2, 2)) == 0.0  # inverted
    assert strict_box_reward("<answer>[0,0,2,2] [0,0,2,2]</answer>", (0, 0, 2, 2)) == 0.0  # several boxes


def test_math_worker_matches_the_anchor_probes():
    assert mathjudge.parse_verify("<answer>40</answer>", "40") == (False, "")  # no space: nothing extracted
    assert mathjudge.parse_verify("<answer> 40 </answer>", "40°")[0]
    assert mathjudge.parse_verify("<think>angle is 30 then 50</think><answer>40</answer>", "50") == (True, "50")
    assert mathjudge.parse_verify("9", "9π")[0]  # π collapses to its coefficient
    assert not mathjudge.parse_verify("1.732", "√{3}")[0]  # unparseable gold is never correct


def test_math_worker_off_the_main_thread_and_bounded():
    out = []
    thread = threading.Thread(target=lambda: out.append(mathjudge.parse_verify("5", "The answer is 5")))
    thread.start()
    thread.join()
    assert out == [(True, "5")]  # math-verify alone returns False (0.5.2) or raises (0.9) in a thread
    slow = mathjudge.MathWorker(timeout=0.2)
    try:
        assert slow.run("parse_verify", [("9" * 4000 + "**" + "9" * 4000 + "**9", "1")]) == [(False, "")]
        assert slow.timeouts == 1
        assert slow.run("parse_verify", [(" 7", "7")]) == [(True, "7")]  # restarted
    finally:
        slow.close()
