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
