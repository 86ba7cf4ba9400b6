"""``hf_env``: the cluster's environment switch (``hf_env.set_env(NAME)``) as existing scripts call it."""
