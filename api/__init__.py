"""The client layer (folder api/): how a user's process talks to the cluster.

Below every consumer (the CLI, the web service, storage's client, the in-job ``hfai.client``),
above ``hfai.protocol``; it imports none of them (docs/architecture.md, "Layers"):

- :mod:`hfai.api.client`: ``ApiClient`` (the controller API over NATS), ``JobFilter``, credentials;
- :mod:`hfai.api.config`: which cluster and who (``cli_config``, ``current_user``, a local cluster's state file);
- :mod:`hfai.api.spec`: what a command runs (``entry_script``) and durations (``parse_duration``);
- :mod:`hfai.api.workspace`: the marker of a pushed workspace (``remote_workdir``).

Nothing is imported here, so ``import hfai.api.spec`` stays as light as its own imports.
"""
