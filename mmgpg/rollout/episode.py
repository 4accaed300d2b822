"""Multi-turn episodes with tools ("thinking with images"): generate until a tool call or the end, run the tool, show
its observation, continue — batched across the episodes of a call, which end at different turns.

A task that offers tools (``Task.tools``: names in :data:`mmgpg.tools.TOOLS`) is rolled out by
:func:`generate_episodes` instead of one ``engine.generate``: every consumer (training, ``mmgpg eval``, ``mmgpg
sample``) goes through :func:`mmgpg.rollout.collect.sample_groups` or :func:`rollout`, which choose.

**Prompt.** :func:`with_tools` adds the tools to the conversation's system message in Qwen's function-calling format
(the ``# Tools`` block with the JSON schemas inside ``<tools></tools>`` and the ``<tool_call>`` instruction: the text
Qwen2.5's and Qwen3's chat templates render for ``tools=``; Qwen2-VL's and Qwen2.5-VL's templates have no tools
section, so mmgpg writes the same block for every family).

**Turns.** Turn 1 is the engine's ordinary ``generate`` (G completions per prompt). After each turn, an episode whose
turn ended with an EOS token and holds a ``<tool_call>`` runs it (:func:`mmgpg.tools.call_tool`: parse, check,
run under a time limit; every failure is an error observation) and appends the observation as a user turn —
``<tool_response>`` text and images, rendered by the family's own chat template
(:meth:`~mmgpg.models.qwen_vl.QwenVLPolicy.encode_observation`) and appended as *tokens*, so the next turn is
generated from exactly the token sequence the trainer scores (no decode / re-encode of the policy's text). The
active episodes' next turns are generated together from those sequences (``engine.generate_from``: the HF engine's
``generate`` on the padded contexts; vLLM takes the token ids, each image's placeholder run collapsed to the one
placeholder its processor expands again, and checks its expansion against ours). An episode ends
at a turn without a tool call (its answer), or at a limit (:class:`EpisodeLimits`: policy turns, observation images,
tokens after the prompt), recorded in :attr:`Episode.limit`.

**Training.** The episode is one sequence after the prompt; :func:`episode_batch` returns it as a
:class:`~mmgpg.models.batch.CompletionBatch` whose ``completion_mask`` is 1 exactly on the policy's own tokens and
whose ``context_mask`` covers the observations too: every loss, aggregation, α/β_th count and the rollout
correction see only the policy's tokens; the forward attends to everything and encodes the observation images with
the prompt's. The rewards see the whole episode's text (the policy's turns and the tool responses, special tokens
left out).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mmgpg.models.batch import CompletionBatch, PromptBatch, extend_prompts, is_image_part, join_vision
from mmgpg.models.logprobs import pad_completions
from mmgpg.rollout.engine import Sampling
from mmgpg.tools import ERROR_KINDS, EpisodeState, call_tool, parse_tool_call, tool_schemas

LIMITS = ("turns", "images", "tokens")
TURN_STREAM = -31  # in a later turn's seed key (negative: never a training step or mmgpg eval's stream)


@dataclass(frozen=True)
class EpisodeLimits:
    """How far an episode may go: ``max_turns`` policy turns, ``max_images`` observation images, ``max_tokens``
    tokens after the prompt (the policy's turns and the observations), and ``tool_timeout_s`` per tool call. A limit
    ends the episode (its last turn is kept); they hold however often the model calls tools."""

    max_turns: int = 4
    max_images: int = 8
    max_tokens: int = 2048
    tool_timeout_s: float = 10.0

    def __post_init__(self):
        if self.max_turns < 1 or self.max_images < 0 or self.max_tokens < 1 or not self.tool_timeout_s > 0:
            raise ValueError(f"episode limits need max_turns >= 1, max_images >= 0, max_tokens >= 1 and "
                             f"tool_timeout_s > 0; got {self}")


@dataclass
class Turn:
    """One policy turn: its text, the tool call it made (as parsed; None: no call), the call's error kind
    (:data:`mmgpg.tools.ERROR_KINDS`) and the observation shown after it (text, image sizes)."""

    text: str
    tool_call: dict | None = None
    error: str | None = None
    observation: str | None = None
    image_sizes: list[list[int]] = field(default_factory=list)


@dataclass
class Episode:
    """One episode after its prompt: the tokens (``ids``), which of them the policy generated (``policy``), their mm
    token types, the engine's log-prob of each policy token (0 elsewhere; None: the engine gave none), the
    observation images' vision inputs and images, the turns, the tools' view (:class:`mmgpg.tools.EpisodeState`),
    and the limit that ended it (None: it ended with an answer)."""

    state: EpisodeState
    ids: list[int] = field(default_factory=list)
    policy: list[bool] = field(default_factory=list)
    mm: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    vision: list[dict] = field(default_factory=list)
    media: list = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    limit: str | None = None
    done: bool = False

    @property
    def calls(self) -> int:
        return sum(t.tool_call is not None or t.error == "malformed" for t in self.turns)

    def record(self) -> dict[str, Any]:
        """The episode as a JSON-able record (``mmgpg eval``'s predictions.jsonl ``episode`` field)."""
        return {"turns": [dataclasses.asdict(t) for t in self.turns], "limit": self.limit, "tool_calls": self.calls}


def tools_block(schemas: Sequence[dict]) -> str:
    """Qwen's function-calling instructions for ``schemas`` (the ``# Tools`` block of Qwen2.5's and Qwen3's chat
    templates: one JSON schema per line inside ``<tools></tools>``, then how to write a ``<tool_call>``)."""
    listed = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
            f"function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n</tools>\n\nFor each function "
            "call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def with_tools(conversation: list[dict], tools: Sequence[str]) -> list[dict]:
    """``conversation`` with the tools' block (:func:`tools_block`) after its system message's text, or as a system
    message of its own when it has none (as Qwen3's template renders ``tools=``)."""
    block = tools_block(tool_schemas(tools))
    if conversation and conversation[0].get("role") == "system":
        content = conversation[0]["content"]
        text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
        return [{"role": "system", "content": f"{text}\n\n{block}" if text else block}, *conversation[1:]]
    return [{"role": "system", "content": block}, *conversation]


def episode_prompt(task, example) -> list[dict]:
    """The conversation a task's example is rolled out from: :meth:`Task.prompt`, with the task's tools' block
    (:func:`with_tools`) unless the task describes its tools itself (``Task.describe_tools`` false)."""
    conversation = task.prompt(example)
    described = getattr(task, "tools", ()) and getattr(task, "describe_tools", True)
    return with_tools(conversation, task.tools) if described else conversation


def task_limits(task) -> EpisodeLimits:
    """The task's :class:`EpisodeLimits` (``Task.episode_limits``; the defaults when it sets none)."""
    limits = getattr(task, "episode_limits", None)
    return limits if isinstance(limits, EpisodeLimits) else EpisodeLimits()


def _check_takes_tools(policy, task) -> None:
    """A policy whose family cannot take images between turns (``Family.takes_tools``, the one fact
    :func:`mmgpg.task.check_task_for_model` refuses such a run by at start-up) cannot continue an episode."""
    if not policy.spec.takes_tools:
        raise ValueError(f"task {task.name!r} offers tools, which need a policy that takes images between turns (the "
                         f"Qwen-VL families); {policy.spec.title} does not")


def _original_images(conversation: list[dict], media: list) -> list:
    """The conversation's images as the tools see them: full resolution (a PIL image or a local file as given), so
    that a zoom shows detail the resized prompt image lost; otherwise (a URL, base64) the policy's loaded copy
    (``media``: the prompt's loaded media, :attr:`~mmgpg.models.batch.PromptBatch.media`; videos are pairs)."""
    from PIL import Image

    loaded = [m for m in media if not isinstance(m, tuple)]
    parts = [p for m in conversation if isinstance(m.get("content"), list) for p in m["content"] if is_image_part(p)]
    out = []
    for i, part in enumerate(parts):
        source = part.get("image", part.get("image_url"))
        if isinstance(source, Image.Image):
            out.append(source)
        elif isinstance(source, str) and "://" not in source and not source.startswith("data:"):
            with Image.open(source) as image:
                out.append(image.convert("RGB"))
        elif i < len(loaded):
            out.append(loaded[i])
    return out


def _add_turn(policy, episode: Episode, ids: list[int], logprobs: list[float] | None, budget: int) -> None:
    """Append a generated turn (cut at the episode's remaining token budget)."""
    ids = ids[:budget]
    episode.ids += ids
    episode.policy += [True] * len(ids)
    episode.mm += [0] * len(ids)
    if episode.logprobs is not None and logprobs is not None:
        episode.logprobs += list(logprobs[: len(ids)])
    else:
        episode.logprobs = None
    episode.turns.append(Turn(policy.tokenizer.decode(ids, skip_special_tokens=True)))


def _after_turn(policy, episode: Episode, tools: Sequence[str], limits: EpisodeLimits) -> None:
    """Run the last turn's tool call and append its observation, or end the episode (an answer, or a limit)."""
    turn = episode.turns[-1]
    if not episode.ids or episode.ids[-1] not in policy.eos_token_ids:  # cut by max_new_tokens or the token budget
        episode.done, episode.limit = True, "tokens"
        return
    try:
        call = parse_tool_call(turn.text)
    except ValueError:
        call = None
        turn.error = "malformed"
    else:
        if call is None:
            episode.done = True  # its answer
            return
        turn.tool_call = {"name": call.name, "arguments": call.arguments}
    if len(episode.turns) >= limits.max_turns:
        episode.done, episode.limit = True, "turns"
        return
    observation = call_tool(turn.text, tools, episode.state, timeout_s=limits.tool_timeout_s)
    turn.error = observation.error
    images = list(observation.images)
    if len(episode.media) + len(images) > limits.max_images:
        episode.done, episode.limit = True, "images"
        return
    content = [{"type": "text", "text": "<tool_response>\n"}, *({"type": "image", "image": im} for im in images),
               {"type": "text", "text": f"{observation.text}\n</tool_response>"}]
    ids, mm, vision, loaded = policy.encode_observation(content)
    if len(episode.ids) + len(ids) >= limits.max_tokens:  # no room for a next turn
        episode.done, episode.limit = True, "tokens"
        return
    turn.observation = observation.text
    turn.image_sizes = [list(im.size) for im in loaded]
    episode.state.images += images
    episode.ids += ids
    episode.policy += [False] * len(ids)
    episode.mm += mm
    if episode.logprobs is not None:
        episode.logprobs += [0.0] * len(ids)
    if vision:
        episode.vision.append(vision)
    episode.media += loaded


def generate_episodes(engine, task, conversations: Sequence[list[dict]], group_size: int,
                      sampling: Sampling) -> CompletionBatch:
    """``group_size`` episodes per conversation (prompt-major), with the task's tools and limits, as one
    :func:`episode_batch`. ``conversations`` already hold the tools' block (:func:`episode_prompt`)."""
    policy = engine.policy
    tools, limits = tuple(task.tools), task_limits(task)
    _check_takes_tools(policy, task)
    generate_from = getattr(engine, "generate_from", None)
    if generate_from is None:
        raise ValueError(f"task {task.name!r} offers tools: the {getattr(engine, 'name', type(engine).__name__)} "
                         "rollout engine cannot continue an episode from its tokens yet; use rollout.engine=hf")
    first = engine.generate(conversations, group_size, sampling)
    prompts = first.prompts
    originals = [_original_images(c, media) for c, media in zip(conversations, prompts.media)]  # once per prompt
    episodes = [Episode(EpisodeState(list(originals[r // group_size]))) for r in range(first.num_sequences)]
    out, active, turn = first, list(range(len(episodes))), 1
    while True:
        for i, r in enumerate(active):
            n = int(out.completion_mask[i].sum())
            lp = None if out.sampled_logprobs is None else out.sampled_logprobs[i, :n].tolist()
            _add_turn(policy, episodes[r], out.completion_ids[i, :n].tolist(), lp,
                      limits.max_tokens - len(episodes[r].ids))
            _after_turn(policy, episodes[r], tools, limits)
        active = [r for r, e in enumerate(episodes) if not e.done]
        if not active:
            break
        context = extend_prompts(prompts, [(r // group_size, episodes[r].ids, episodes[r].mm, episodes[r].vision,
                                            episodes[r].media) for r in active], policy.pad_token_id)
        budget = min(sampling.max_new_tokens, max(limits.max_tokens - len(episodes[r].ids) for r in active))
        turn += 1  # an engine with per-request seeds draws each turn from seeds of its own (the turn in the key)
        key = None if sampling.seed_key is None else (*sampling.seed_key, TURN_STREAM, turn, sampling.first_prompt)
        out = generate_from(context, dataclasses.replace(sampling, max_new_tokens=budget, seed_key=key, first_prompt=0))
    return episode_batch(policy, prompts, group_size, episodes)


def scripted_episodes(policy, task, conversations: Sequence[list[dict]],
                      turns: Sequence[Sequence[str]]) -> CompletionBatch:
    """Episodes whose policy turns are given (``turns[p]``: the texts of conversation ``p``'s turns, each followed by
    the first EOS id), with the task's real tools run between them exactly as in :func:`generate_episodes`: SFT on a
    tool task's gold episodes (``Task.gold_completion`` returning a list of turns), and the tests' scripted
    episodes. A turn after the episode has ended (an answer or a limit) is an error."""
    _check_takes_tools(policy, task)
    tools, limits = tuple(task.tools), task_limits(task)
    prompts = policy.encode_prompts(conversations)
    episodes = []
    for p, texts in enumerate(turns):
        episode = Episode(EpisodeState(_original_images(conversations[p], prompts.media[p])))
        for k, text in enumerate(texts):
            if episode.done:
                raise ValueError(f"episode {p}: turn {k} follows the end of the episode ({episode.limit or 'answer'})")
            ids = policy.tokenizer(text, add_special_tokens=False)["input_ids"] + [policy.eos_token_ids[0]]
            _add_turn(policy, episode, ids, None, limits.max_tokens - len(episode.ids))
            _after_turn(policy, episode, tools, limits)
        episodes.append(episode)
    return episode_batch(policy, prompts, 1, episodes)


def episode_batch(policy, prompts: PromptBatch, group_size: int, episodes: Sequence[Episode]) -> CompletionBatch:
    """Episodes as one batch: each row's tokens after its prompt, ``completion_mask`` on the policy's tokens,
    ``context_mask`` on all of them, the observations' mm token types and vision inputs per row, the engine's
    log-probs (0 off the policy's tokens; None unless every episode has them) and the texts the rewards see."""
    ids, context = pad_completions([e.ids for e in episodes], policy.pad_token_id)
    width = ids.shape[1]

    def padded(values, dtype):
        return torch.tensor([list(v) + [0] * (width - len(v)) for v in values], dtype=dtype)

    logprobs = None
    if all(e.logprobs is not None for e in episodes):
        logprobs = padded([e.logprobs for e in episodes], torch.float32)
    texts = policy.tokenizer.batch_decode(ids.masked_fill(~context, policy.pad_token_id), skip_special_tokens=True)
    return CompletionBatch(prompts, group_size, ids, padded([e.policy for e in episodes], torch.bool), texts,
                           sampled_logprobs=logprobs, context_mask=context,
                           completion_mm=padded([e.mm for e in episodes], torch.long),
                           row_vision=[join_vision(e.vision) for e in episodes], episodes=list(episodes))


def rollout(engine, task, examples: Sequence, group_size: int, sampling: Sampling) -> CompletionBatch:
    """``group_size`` completions (single-turn) or episodes (a task with tools) for each example: the one call every
    consumer makes."""
    conversations = [episode_prompt(task, ex) for ex in examples]
    if getattr(task, "tools", ()):
        return generate_episodes(engine, task, conversations, group_size, sampling)
    return engine.generate(conversations, group_size, sampling)


def episode_fields(out: CompletionBatch, row: int) -> dict[str, Any]:
    """A predictions row's ``episode`` field (:meth:`Episode.record`: the turns' text, tool calls, errors and
    observation image sizes) for row ``row`` of ``out``; nothing for a single-turn batch."""
    return {} if out.episodes is None else {"episode": out.episodes[row].record()}


def episode_sums(episodes: Sequence[Episode], tools: Sequence[str]) -> dict[str, float]:
    """Sums over ``episodes`` (to add up across ranks, then :func:`episode_means`): ``tools/episodes``,
    ``tools/calls_per_episode`` (calls, made or malformed), ``tools/calls/<tool>`` for each offered tool,
    ``tools/turns``, ``tools/invalid_calls`` (calls that got an error observation) and ``tools/errors/<kind>``, and
    ``tools/limit_share`` (episodes ended by a limit; ``tools/limit/<which>`` each)."""
    turns = [t for e in episodes for t in e.turns]
    out = {"tools/episodes": float(len(episodes)), "tools/calls_per_episode": float(sum(e.calls for e in episodes)),
           "tools/turns": float(len(turns)), "tools/invalid_calls": float(sum(t.error is not None for t in turns)),
           "tools/limit_share": float(sum(e.limit is not None for e in episodes))}
    for name in tools:
        out[f"tools/calls/{name}"] = float(sum(t.tool_call is not None and t.tool_call["name"] == name for t in turns))
    for kind in ERROR_KINDS:
        out[f"tools/errors/{kind}"] = float(sum(t.error == kind for t in turns))
    for which in LIMITS:
        out[f"tools/limit/{which}"] = float(sum(e.limit == which for e in episodes))
    return out


def group_episode_sums(groups: Sequence, tools: Sequence[str]) -> dict[str, float]:
    """:func:`episode_sums` over the episodes of scored groups (:class:`mmgpg.rollout.collect.Group`); nothing for a
    task without tools."""
    return episode_sums([e for g in groups for e in g.episodes or ()], tools) if tools else {}


def episode_means(sums: dict[str, float]) -> dict[str, float]:
    """The ``tools/*`` sums of :func:`episode_sums` (possibly added up over ranks, among other keys) per episode.

    >>> e = Episode(EpisodeState(), turns=[Turn("a", {"name": "zoom", "arguments": {}}), Turn("b")])
    >>> f = Episode(EpisodeState(), turns=[Turn("c", error="malformed")], limit="turns")
    >>> m = episode_means(episode_sums([e, f], ["zoom"]))
    >>> m["tools/calls_per_episode"], m["tools/calls/zoom"], m["tools/invalid_calls"], m["tools/limit_share"]
    (1.0, 0.5, 0.5, 0.5)
    """
    n = max(sums.get("tools/episodes", 0.0), 1.0)
    return {k: v / n for k, v in sums.items() if k.startswith("tools/") and k != "tools/episodes"}
