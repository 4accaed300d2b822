"""Tools that misbehave (raise, refuse, run slowly, return junk), registered for the tests of mmgpg.tools and of
multi-turn episodes: each must become an error observation, never an exception."""

from __future__ import annotations

import time

from mmgpg.tools import TOOLS, Observation, Tool, ToolError


def _raises(arguments, state):
    raise RuntimeError("disk on fire")


def _slow(arguments, state):
    time.sleep(3)
    return Observation("late")


def _wrong(arguments, state):
    return "a string"


def _refuses(arguments, state):
    raise ToolError("no such region")


BAD_TOOLS = {"t_raises": _raises, "t_slow": _slow, "t_wrong": _wrong, "t_refuses": _refuses}


def register_bad_tools() -> tuple[str, ...]:
    """Register :data:`BAD_TOOLS` (schema: any object) in :data:`mmgpg.tools.TOOLS`; their names."""
    for name, fn in BAD_TOOLS.items():
        TOOLS.register(name, Tool(name, "test", {"type": "object"}, fn), replace=True)
    return tuple(BAD_TOOLS)
