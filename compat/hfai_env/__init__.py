"""``hfai_env``: the newer name of :mod:`hf_env` (``hfai_env.set_env(NAME)``), the same functions."""

from hfai.env_switch import EnvironmentMismatch, EnvironmentNotFound, EnvSwitchWarning, set_env

__all__ = ["EnvSwitchWarning", "EnvironmentMismatch", "EnvironmentNotFound", "set_env"]
