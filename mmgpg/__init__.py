"""mmgpg: Group Policy Gradient (GPG) and GRPO baselines for vision-language models."""

__version__ = "0.1.0"
