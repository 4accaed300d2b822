"""What the tests share: fixture tasks, the fault tests' helpers, the independent gradient reference, the judge
corpora and the authors' judges reimplemented for differential tests, a seam plugin, and small data fixtures
(``fixtures/``). Imported as ``support.<module>`` (pytest puts ``tests/`` on the path: ``pythonpath`` in
pyproject.toml)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository root."""
FIXTURE_TASKS = Path(__file__).with_name("fixture_tasks.py")
"""The fixture task file, loaded by the tests as ``task=<FIXTURE_TASKS>:ParityShapes`` (which also exercises the
path/to/file.py:Class loader)."""
FIXTURES = Path(__file__).with_name("fixtures")
"""Small data files (``fixtures/README.md`` says where each comes from)."""

MEASURED = ("time/", "throughput/", "memory/", "plan/")
"""Metric namespaces that are measurements of this machine and process (wall times, throughput, peak memory) or
written once per process start (``plan/``): they differ between runs that compute the same thing."""


def comparable(metrics: list[dict]) -> list[dict]:
    """``metrics.jsonl`` records without the :data:`MEASURED` keys: what an exact resume must reproduce."""
    return [{k: v for k, v in m.items() if not k.startswith(MEASURED)} for m in metrics]


def comparable_run(run: Path) -> list[dict]:
    """:func:`comparable` of a run directory's ``metrics.jsonl``."""
    import json

    return comparable([json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()])
