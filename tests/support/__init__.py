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

def run_mmgpg(*args: str, check: bool = True, ranks: int = 1, env: dict | None = None, cwd: Path | None = None,
              timeout: float = 900):
    """``python -m mmgpg ARGS`` in a subprocess (under ``torch.distributed.run --standalone --nproc_per_node ranks``
    when ``ranks > 1``), output captured; with ``check``, a non-zero exit fails the test with the command, its
    stdout and stderr. ``env`` (default: this process's) is the child's whole environment."""
    import subprocess
    import sys

    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)] if ranks > 1 else []
    proc = subprocess.run([sys.executable, *launcher, "-m", "mmgpg", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"mmgpg {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


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
