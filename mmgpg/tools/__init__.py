"""Tools a model can call during an episode ("thinking with images"): the contract, its registry, and the one path
from model text to an observation.

A tool is data plus a plain Python function (:class:`Tool`): a name, a description and a JSON schema for its
arguments (what a chat template's tools section shows the model), and ``fn(arguments, state) -> Observation``.
:class:`EpisodeState` holds what the episode has seen (its images, in order: the prompt's, then every observation's),
so a tool can crop any of them. A task declares the tools it offers by name (``Task.tools``); the names resolve in
:data:`TOOLS`: the built-ins of :mod:`mmgpg.tools.image` (``zoom``, ``rotate``), ``TOOLS.register`` from code, or a
plugin's entry point (``[project.entry-points."mmgpg.tools"] my_tool = "pkg.mod:MY_TOOL"``). A tool's code comes
from an installed package or a file the user names; model output only ever selects a registered name and fills
arguments that are checked against the schema. Nothing from model text reaches ``eval``, ``exec`` or a shell.

From model text to observation, :func:`call_tool`: :func:`parse_tool_call` reads the first
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen's tool-call format, as its chat templates ask
for it); the name must be one the task offers; the arguments must validate against the tool's schema (``jsonschema``,
Draft 2020-12); the function runs under a time limit. Every failure (malformed JSON, an unknown tool, arguments
outside the schema, a box outside the image, an exception, a time-out) becomes an error observation that the episode
shows the model, counted by its kind (:attr:`Observation.error`), never an exception out of the episode.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmgpg.registry import Registry

__all__ = ["TOOLS", "EpisodeState", "Observation", "Tool", "ToolCall", "ToolError", "call_tool", "parse_tool_call",
           "tool_schemas"]

# The error kinds an observation can carry (the episode metrics count each).
ERROR_KINDS = ("malformed", "unknown_tool", "bad_arguments", "tool_error", "timeout")
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class ToolError(Exception):
    """Raised by a tool function for a call it cannot serve (e.g. a box outside the image): the model sees the
    message as an error observation (kind ``tool_error``)."""


@dataclass
class Observation:
    """What a tool call returns to the model: text and/or images (PIL), and ``error`` (one of :data:`ERROR_KINDS`)
    when the call failed: then ``text`` says why."""

    text: str = ""
    images: list = field(default_factory=list)
    error: str | None = None


@dataclass
class EpisodeState:
    """What an episode has seen so far: its images in order (the prompt's first, then each observation's), and the
    number of tool calls made."""

    images: list = field(default_factory=list)
    calls: int = 0


@dataclass(frozen=True)
class Tool:
    """A tool: ``name`` (what the model writes), ``description`` and ``parameters`` (a JSON schema of the arguments
    object, shown to the model), and ``fn(arguments, state) -> Observation`` (plain Python; raise :class:`ToolError`
    for a call it cannot serve)."""

    name: str
    description: str
    parameters: dict
    fn: Callable[[dict, EpisodeState], Observation]

    def schema(self) -> dict:
        """The OpenAI-style function schema chat templates render (``{"type": "function", "function": {...}}``)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: the tool's name and its arguments (not yet checked)."""

    name: str
    arguments: dict


TOOLS = Registry("tool", "mmgpg.tools", {"zoom": "mmgpg.tools.image:ZOOM", "rotate": "mmgpg.tools.image:ROTATE"})


def tool_schemas(names: Sequence[str]) -> list[dict]:
    """The function schemas of the named tools, for ``apply_chat_template(..., tools=...)``."""
    return [TOOLS[n].schema() for n in names]


def parse_tool_call(text: str) -> ToolCall | None:
    """The first ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in ``text``; None when there is none;
    a ValueError (its message for the model) when its content is not such a JSON object.

    >>> parse_tool_call('look <tool_call>{"name": "zoom", "arguments": {"bbox_2d": [0, 0, 500, 500]}}</tool_call>')
    ToolCall(name='zoom', arguments={'bbox_2d': [0, 0, 500, 500]})
    >>> parse_tool_call("<answer>3</answer>") is None
    True
    """
    found = TOOL_CALL.search(text)
    if found is None:
        return None
    try:
        call = json.loads(found.group(1))
    except json.JSONDecodeError as err:
        raise ValueError(f"the tool call is not valid JSON ({err.msg} at character {err.pos})") from None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ValueError('a tool call is a JSON object {"name": "...", "arguments": {...}}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise ValueError("the tool call's arguments are not a JSON object") from None
    if not isinstance(arguments, dict):
        raise ValueError("the tool call's arguments are not a JSON object")
    return ToolCall(call["name"], arguments)


def call_tool(text: str, offered: Sequence[str], state: EpisodeState, *, timeout_s: float = 10.0) -> Observation | None:
    """Run the tool call in ``text`` (None when it makes none): parsed, its name among ``offered``, its arguments
    checked against the schema, the function run for at most ``timeout_s`` seconds. Every failure is an error
    observation (:data:`ERROR_KINDS`); ``state.calls`` counts every call made, failed or not."""
    from jsonschema import Draft202012Validator

    try:
        call = parse_tool_call(text)
    except ValueError as err:
        state.calls += 1
        return Observation(f"Error: {err}.", error="malformed")
    if call is None:
        return None
    state.calls += 1
    if call.name not in offered:
        return Observation(f"Error: there is no tool {call.name!r}; the tools are {', '.join(offered)}.",
                           error="unknown_tool")
    tool = TOOLS[call.name]
    problems = sorted(Draft202012Validator(tool.parameters).iter_errors(call.arguments), key=lambda e: list(e.path))
    if problems:
        where = "/".join(str(p) for p in problems[0].path) or "arguments"
        return Observation(f"Error: {call.name} {where}: {problems[0].message}.", error="bad_arguments")
    return _run(tool, call.arguments, state, timeout_s)


def _run(tool: Tool, arguments: dict, state: EpisodeState, timeout_s: float) -> Observation:
    """The tool's function in a worker thread, waited for at most ``timeout_s``; a function that does not return
    by then is abandoned (Python cannot stop a thread: it finishes in the background, its result dropped)."""
    out: dict[str, Any] = {}

    def work():
        try:
            out["result"] = tool.fn(arguments, state)
        except ToolError as err:
            out["error"] = Observation(f"Error: {err}", error="tool_error")
        except Exception as err:  # noqa: BLE001 - a tool's bug becomes an observation, the episode goes on
            out["error"] = Observation(f"Error: {tool.name} failed ({type(err).__name__}: {err}).", error="tool_error")

    worker = threading.Thread(target=work, daemon=True, name=f"mmgpg-tool-{tool.name}")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return Observation(f"Error: {tool.name} took longer than {timeout_s:g} s.", error="timeout")
    if "error" in out:
        return out["error"]
    result = out.get("result")
    if not isinstance(result, Observation):
        return Observation(f"Error: {tool.name} returned {type(result).__name__}, not an Observation.",
                           error="tool_error")
    return result
