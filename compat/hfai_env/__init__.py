"""``hfai_env``: the newer name of :mod:`hf_env` (``hfai_env.set_env(NAME)``)."""
