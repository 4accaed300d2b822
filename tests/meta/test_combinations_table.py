"""docs/distributed.md's "Which combinations work" table cannot drift from the code: every ``tested`` cell names a
test that exists, parametrized with an id that is that cell; every ``refused`` cell is refused by the config check
(mmgpg.config.checks) with a message that contains the cell's text; the ``hf`` rows cover every combination once;
``see below`` (a placeholder) is for the ``vllm`` rows only. The checker is also run on altered tables, so it is seen
to catch each kind of drift."""

from __future__ import annotations

import importlib.util
import itertools
import re
from dataclasses import dataclass

import pytest
from support import REPO

DOC = REPO / "docs" / "distributed.md"
HEADER = "| engine | backend | adapter | algo | status |"
VALUES = {"engine": ("hf", "vllm"), "backend": ("plain", "zero2", "zero3"), "adapter": ("full", "lora"),
          "algo": ("gpg", "grpo")}
# What each column value means as configuration (the table's own definition, docs/distributed.md)
OVERRIDES = {"hf": ["rollout.engine=hf"], "vllm": ["rollout.engine=vllm"], "plain": ["train.backend=plain"],
             "zero2": ["train.backend=deepspeed", "train.zero_stage=2"],
             "zero3": ["train.backend=deepspeed", "train.zero_stage=3"], "full": ["model.lora.rank=0"],
             "lora": ["model.lora.rank=4"], "gpg": ["algo=gpg"], "grpo": ["algo=grpo"]}


@dataclass(frozen=True)
class Row:
    engine: str
    backend: str
    adapter: str
    algo: str
    status: str

    @property
    def cell(self) -> tuple[str, str, str, str]:
        return self.engine, self.backend, self.adapter, self.algo


def parse_table(text: str) -> list[Row]:
    """The rows of the table under ``## Which combinations work`` (the first table after that heading)."""
    start = text.index("## Which combinations work")
    lines = text[start:].splitlines()
    at = lines.index(HEADER)  # ValueError: the header changed
    rows = []
    for line in lines[at + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 5, f"not 5 columns: {line}"
        rows.append(Row(*cells))
    return rows


def _test_ids(fn) -> set[str] | None:
    """The explicit ids of ``fn``'s parametrize marks (None: not parametrized)."""
    marks = [m for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
    if not marks:
        return None
    ids = set()
    for m in marks:
        ids.update(p.id for p in m.args[1] if getattr(p, "id", None))
        ids.update(i for i in (m.kwargs.get("ids") or []) if isinstance(i, str))
    return ids


def _tested_problem(row: Row, ref: str) -> str | None:
    match = re.fullmatch(r"([\w/.-]+\.py)::(\w+)(?:\[([\w.-]+)\])?", ref)
    if not match:
        return f"{row.cell}: 'tested: {ref}' is not <file>::<test>[<id>]"
    path, name, test_id = REPO / match[1], match[2], match[3]
    if not path.is_file():
        return f"{row.cell}: {match[1]} does not exist"
    spec = importlib.util.spec_from_file_location(f"_table_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        return f"{row.cell}: {match[1]} has no test {name}"
    ids = _test_ids(fn)
    if ids is None:
        return None if test_id is None else f"{row.cell}: {name} is not parametrized, but the table names [{test_id}]"
    if test_id not in ids:
        return f"{row.cell}: {name} has no parameter id [{test_id}] (it has {sorted(ids)})"
    if set(test_id.split("-")) != {row.backend, row.adapter, row.algo}:
        return f"{row.cell}: [{test_id}] is another combination's test"
    return None


def _refused_problem(row: Row, gist: str) -> str | None:
    from mmgpg.config import ConfigError, resolve

    args = ["model=tiny", *itertools.chain.from_iterable(OVERRIDES[v] for v in row.cell)]
    try:
        resolve(args)
    except ConfigError as err:
        messages = [str(p) for p in err.problems]
        if any(gist in m for m in messages):
            return None
        return f"{row.cell}: refused, but no message contains {gist!r}: {messages}"
    return f"{row.cell}: the table says refused ({gist!r}), but the config check accepts {args}"


def table_problems(rows: list[Row]) -> list[str]:
    """Every way ``rows`` disagree with the repository (empty: the table is true)."""
    problems = []
    seen: dict[tuple, int] = {}
    for row in rows:
        bad = [f"{k}={getattr(row, k)!r}" for k, allowed in VALUES.items() if getattr(row, k) not in allowed]
        if bad:
            problems.append(f"{row.cell}: unknown {', '.join(bad)} (allowed: {VALUES})")
            continue
        seen[row.cell] = seen.get(row.cell, 0) + 1
        kind, _, text = row.status.partition(":")
        if row.status == "see below":
            if row.engine != "vllm":
                problems.append(f"{row.cell}: 'see below' is a placeholder for the vllm rows only")
        elif kind == "tested" and text.strip():
            problems.append(_tested_problem(row, text.strip()))
        elif kind == "refused" and text.strip():
            problems.append(_refused_problem(row, text.strip()))
        else:
            problems.append(f"{row.cell}: status {row.status!r} is not 'tested: ...', 'refused: ...' or 'see below'")
    problems += [f"{cell}: {n} rows" for cell, n in seen.items() if n > 1]
    hf = set(itertools.product(["hf"], *[VALUES[k] for k in ("backend", "adapter", "algo")]))
    problems += [f"{cell}: no row" for cell in sorted(hf - set(seen))]
    return [p for p in problems if p]


def test_the_docs_table_is_true():
    rows = parse_table(DOC.read_text(encoding="utf-8"))
    assert len([r for r in rows if r.engine == "hf"]) == 12
    assert table_problems(rows) == []


def _doc_rows() -> list[Row]:
    return parse_table(DOC.read_text(encoding="utf-8"))


def _replace(rows: list[Row], cell: tuple, status: str) -> list[Row]:
    return [Row(*r.cell, status) if r.cell == cell else r for r in rows]


@pytest.mark.parametrize(("status", "expected"), [
    # LoRA under ZeRO-3 was refused before issue 25; a stale row saying so is caught
    ("refused: LoRA runs on the plain backend only", "but the config check accepts"),
    ("tested: tests/integration/test_hf_matrix.py::test_cell[plain-full-gpg]", "another combination's test"),
    ("tested: tests/integration/test_hf_matrix.py::test_cell[zero4-lora-grpo]", "has no parameter id"),
    ("tested: tests/integration/test_hf_matrix.py::test_nothing", "has no test test_nothing"),
    ("tested: tests/integration/test_missing.py::test_cell", "does not exist"),
    ("see below", "placeholder for the vllm rows only"),
    ("works", "is not 'tested: ...'"),
])
def test_the_checker_catches_drift(status, expected):
    rows = _replace(_doc_rows(), ("hf", "zero3", "lora", "grpo"), status)
    [problem] = table_problems(rows)
    assert expected in problem and "('hf', 'zero3', 'lora', 'grpo')" in problem, problem


def test_the_checker_catches_missing_and_repeated_rows():
    rows = _doc_rows()
    dropped = [r for r in rows if r.cell != ("hf", "plain", "lora", "gpg")]
    assert table_problems(dropped) == ["('hf', 'plain', 'lora', 'gpg'): no row"]
    assert table_problems(rows + rows[:1]) == [f"{rows[0].cell}: 2 rows"]


def test_a_refusal_with_its_message_passes_and_another_message_fails():
    """A real refusal of the config check (the same columns plus an invalid key, as a refused cell's config would
    be): its message's text passes, another text fails."""
    row = Row("hf", "zero2", "full", "gpg", "refused: x")
    OVERRIDES["zero2-offload"] = ["train.backend=deepspeed", "train.zero_stage=2", "train.offload_params=true"]
    try:
        refused = Row("hf", "zero2-offload", "full", "gpg", "")
        assert _refused_problem(refused, "train.zero_stage=3") is None  # offload_params needs ZeRO-3
        assert "no message contains" in _refused_problem(refused, "LoRA runs on the plain backend only")
    finally:
        del OVERRIDES["zero2-offload"]
    assert "accepts" in _refused_problem(row, "anything")
