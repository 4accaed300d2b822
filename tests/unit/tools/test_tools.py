"""The tool contract (mmgpg.tools): from model text to an observation. Every bad call is an error observation of
its kind, never an exception; model text only selects a registered tool and fills schema-checked arguments; the
built-in zoom crops exactly the box asked for."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PIL import Image, ImageDraw

from mmgpg.tools import EpisodeState, call_tool, parse_tool_call, tool_schemas

OFFERED = ("zoom", "rotate")


def _call(name: str, arguments) -> str:
    import json

    return f"I will look closer. <tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def _state() -> EpisodeState:
    image = Image.new("RGB", (200, 100), (10, 10, 10))
    ImageDraw.Draw(image).rectangle((150, 50, 159, 59), fill=(250, 0, 0))  # a red mark at x 150-159, y 50-59
    return EpisodeState([image])


def test_zoom_crops_the_box_on_the_0_1000_grid_and_enlarges_it():
    state = _state()
    obs = call_tool(_call("zoom", {"bbox_2d": [700, 400, 850, 700]}), OFFERED, state)
    assert obs.error is None and state.calls == 1 and len(obs.images) == 1
    # [700, 400, 850, 700] of 200 x 100 = pixels (140, 40)-(170, 70): 30 x 30, enlarged to 112 x 112 (MIN_SIDE)
    want = state.images[0].crop((140, 40, 170, 70)).resize((112, 112))
    got = np.asarray(obs.images[0])
    assert got.shape == (112, 112, 3) and (got == np.asarray(want)).all()
    red = ((got[..., 0] > 200) & (got[..., 1] < 50)).sum()
    assert red > 0.08 * 112 * 112  # the mark (10 x 10 of 30 x 30) fills about 11 % of the crop


def test_rotate_and_image_index():
    state = _state()
    state.images.append(Image.new("RGB", (30, 60)))
    obs = call_tool(_call("rotate", {"angle": 90, "image": 0}), OFFERED, state)
    assert obs.error is None and obs.images[0].size == (100, 200)
    assert call_tool(_call("rotate", {"angle": 90}), OFFERED, state).images[0].size == (60, 30)  # the last image


def test_no_call_is_none_and_not_counted():
    state = _state()
    assert call_tool("<think>easy</think><answer>3</answer>", OFFERED, state) is None and state.calls == 0
    assert parse_tool_call("<tool_call>") is None


@pytest.mark.parametrize("text, kind, words", [
    ("<tool_call>{'name': 'zoom'}</tool_call>", "malformed", "not valid JSON"),
    ("<tool_call>[1, 2]</tool_call>", "malformed", "JSON object"),
    ('<tool_call>{"name": "zoom", "arguments": [1]}</tool_call>', "malformed", "arguments are not a JSON object"),
    (_call("crop", {"bbox_2d": [0, 0, 1, 1]}), "unknown_tool", "there is no tool 'crop'"),
    (_call("__import__('os').system('touch /tmp/pwned')", {}), "unknown_tool", "there is no tool"),
    (_call("zoom", {}), "bad_arguments", "'bbox_2d' is a required property"),
    (_call("zoom", {"bbox_2d": [0, 0, 1200, 10]}), "bad_arguments", "bbox_2d/2"),
    (_call("zoom", {"bbox_2d": [0, 0, 10]}), "bad_arguments", "is too short"),
    (_call("zoom", {"bbox_2d": [0, 0, 10, 10], "shell": "rm -rf /"}), "bad_arguments", "Additional properties"),
    (_call("rotate", {"angle": 45}), "bad_arguments", "is not one of"),
    (_call("zoom", {"bbox_2d": [500, 500, 500, 600]}), "tool_error", "has no area"),
    (_call("zoom", {"bbox_2d": [500, 500, 501, 501]}), "tool_error", "less than a pixel"),
    (_call("zoom", {"bbox_2d": [0, 0, 10, 10], "image": 3}), "tool_error", "there is no image 3"),
])
def test_bad_calls_are_error_observations_of_their_kind(text, kind, words):
    state = _state()
    obs = call_tool(text, OFFERED, state)
    assert obs.error == kind and words in obs.text and not obs.images, obs
    assert state.calls == 1


def test_a_tool_not_offered_by_the_task_is_unknown_to_the_model():
    obs = call_tool(_call("rotate", {"angle": 90}), ("zoom",), _state())
    assert obs.error == "unknown_tool" and "the tools are zoom" in obs.text


@pytest.fixture
def plugin_tools():
    from support.bad_tools import register_bad_tools

    return register_bad_tools()


@pytest.mark.parametrize("name, kind, words", [("t_raises", "tool_error", "RuntimeError: disk on fire"),
                                               ("t_slow", "timeout", "longer than 0.2 s"),
                                               ("t_wrong", "tool_error", "returned str"),
                                               ("t_refuses", "tool_error", "no such region")])
def test_a_tool_that_raises_is_slow_or_returns_junk_is_an_error_observation(plugin_tools, name, kind, words):
    t0 = time.perf_counter()
    obs = call_tool(_call(name, {}), plugin_tools, _state(), timeout_s=0.2)
    assert obs.error == kind and words in obs.text
    assert time.perf_counter() - t0 < 2.5  # the slow tool is not waited for


def test_schemas_are_the_function_format_chat_templates_render():
    zoom, rotate = tool_schemas(["zoom", "rotate"])
    assert zoom["type"] == "function" and zoom["function"]["name"] == "zoom"
    assert zoom["function"]["parameters"]["required"] == ["bbox_2d"] and rotate["function"]["name"] == "rotate"
