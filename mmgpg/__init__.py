"""mmgpg: Group Policy Gradient (GPG) and GRPO baselines for vision-language models.

The package, bottom layer first (each folder's ``__init__`` says what it owns and may import; tests/meta/
test_structure.py checks that no folder imports one above it): the top-level modules (``algorithms``, ``distributed``,
``jsonl``, ``registry``, ``runlock``, ``typed``, ``utils``) < ``models/``, ``task/`` < ``rollout/``, ``backends/`` <
``config/`` < ``rundir`` < ``evaluation/`` < ``theory/`` < ``train/`` < ``cli/``. This ``__init__`` imports nothing (the vLLM
environment imports parts of mmgpg without its dependencies).
"""

__version__ = "0.1.0"
