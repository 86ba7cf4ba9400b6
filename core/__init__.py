"""The daemons' plumbing: what the agent, the controller, the services and the clients share.

The NATS connection (:mod:`hfai.core.nats`), the config file (:mod:`hfai.core.config`), a
daemon's life (:mod:`hfai.core.daemon`), the clock (:mod:`hfai.core.clock`), retries
(:mod:`hfai.core.retry`), the cutoff checks (:mod:`hfai.core.cutoff`) and pushing the account
JWT (:mod:`hfai.core.accounts`). It sits above :mod:`hfai.auth` and :mod:`hfai.protocol` and below
:mod:`hfai.api`, :mod:`hfai.kv` and the daemons (pyproject.toml's import-linter layers), outside
runtime/ (the jobs' own library, which imports it only where a job talks to the cluster).
"""
