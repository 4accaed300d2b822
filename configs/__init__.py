"""mmgpg's YAML config groups (installed as the package data of ``mmgpg.configs``); see mmgpg/config/__init__.py."""
