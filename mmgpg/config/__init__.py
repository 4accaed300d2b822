"""Configuration: the schema (:mod:`.schema`), resolution from YAML groups and overrides (:mod:`.resolve`) and the
checks that report every problem at once (:mod:`.checks`). The rest of mmgpg imports these names from here.

May import: the top-level modules, :mod:`mmgpg.task`, :mod:`mmgpg.models`, :mod:`mmgpg.rollout` and
:mod:`mmgpg.backends` (the checks read their registries). Nothing below imports ``mmgpg.config`` at run time; an
engine or backend receives the resolved :class:`Config` from its caller.
"""

from mmgpg.config.checks import check
from mmgpg.config.resolve import (
    Resolved,
    apply_override,
    available_groups,
    builtin_config_dir,
    config_search_path,
    resolve,
    save_config,
    to_yaml,
)
from mmgpg.config.schema import (
    AlgoConfig,
    Config,
    DataConfig,
    LoraConfig,
    ModelConfig,
    RolloutConfig,
    SftConfig,
    TaskConfig,
    TrainConfig,
)
from mmgpg.typed import ConfigError, Problem, did_you_mean, field_docs, from_dict, to_dict

__all__ = [
    "AlgoConfig", "Config", "ConfigError", "DataConfig", "LoraConfig", "ModelConfig", "Problem", "Resolved",
    "RolloutConfig", "SftConfig", "TaskConfig", "TrainConfig", "apply_override", "available_groups",
    "builtin_config_dir", "check", "config_search_path", "did_you_mean", "field_docs", "from_dict", "resolve",
    "save_config", "to_dict", "to_yaml",
]
