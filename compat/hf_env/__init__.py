"""``hf_env``: the cluster's environment switch (``hf_env.set_env(NAME)``) as existing scripts call it.

One implementation, :mod:`hfai.env_switch`; see its doc (and docs/storage.md, Environments) for
what happens when NAME exists, when it does not, and off the platform.
"""

from hfai.env_switch import EnvironmentMismatch, EnvironmentNotFound, EnvSwitchWarning, set_env

__all__ = ["EnvSwitchWarning", "EnvironmentMismatch", "EnvironmentNotFound", "set_env"]
