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
    paper_box_points,
    paper_box_reward,
    paper_label_match,
    paper_signed_giou,
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
    # the authors' point list: every top-left, then every bottom-right, in units of 1000
    assert paper_box_points("x (1,2),(3,4) y ( 5 , 6 ),( 7 , 8 )") == [(0.001, 0.002), (0.005, 0.006), (0.003, 0.004),
                                                                         (0.007, 0.008)]
    assert paper_box_points("(1" + "0" * 30 + ",2),(3,4)") == [(1e27, 0.002), (0.003, 0.004)]  # any digit count
    assert paper_box_points("(" + "9" * 312 + ",2),(3,4) (1,2),(3,4)") is None  # int / 1000 overflows: theirs raises
    assert paper_box_points("(" + "1" * 4301 + ",2),(3,4)") is None  # int() refuses it
    assert paper_box_points("[1,2,3,4]") == []
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


def test_paper_signed_giou_by_hand():
    """The authors' compute_giou with signed areas, computed by hand (gold (0,0)-(2,2), area 4)."""
    gold = [(0, 0), (2, 2)]
    assert paper_signed_giou(gold, [(1, 1), (3, 3)]) == pytest.approx(1 / 7 - 2 / 9)  # valid boxes: the usual GIoU
    # inverted on both axes, corners (2,2) and (0,0): I = 0, A = (0-2)(0-2) = +4, U = 8, C = 4 -> 0 - (4-8)/4 = 1
    assert paper_signed_giou(gold, [(2, 2), (0, 0)]) == 1.0
    # (4,4) -> (1,1): I = 0, A = +9, U = 13; C uses max(x2) = max(2, 1) and min(x1) = min(0, 4): (2-0)(2-0) = 4
    assert paper_signed_giou(gold, [(4, 4), (1, 1)]) == pytest.approx(0 - (4 - 13) / 4)  # 2.25: reward 3.25 > 2
    # inverted on one axis, (2,0) -> (0,2): A = -4, U = 0 -> IoU 0, C = 4 -> 0 - (4 - 0)/4 = -1; (3,0)->(0,2): A = -6
    assert paper_signed_giou(gold, [(2, 0), (0, 2)]) == -1.0
    assert paper_signed_giou(gold, [(3, 0), (0, 2)]) == pytest.approx(0 - (4 - (4 - 6)) / 4)  # -1.5: reward < 0
    assert paper_box_reward("<answer>(4,4),(1,1)</answer>", "<answer> (0,0),(2,2) </answer>") == pytest.approx(3.25)
    assert paper_box_reward("<answer>(3,0),(0,2)</answer>", "<answer> (0,0),(2,2) </answer>") == pytest.approx(-0.5)
    # strict on the same boxes: 0 (not one valid box); on a valid one the usual GIoU + 1 in [0, 2]
    assert strict_box_reward("<answer>(4,4),(1,1)</answer>", (0, 0, 2, 2)) == 0.0
    assert strict_box_reward("<answer>(1,1),(3,3)</answer>", (0, 0, 2, 2)) == pytest.approx(1 + 1 / 7 - 2 / 9)
