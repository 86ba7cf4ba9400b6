"""hfai.storage: workspaces pushed to the cluster, storage rules, datasets and environments.

The client side (``hfai workspace``) cuts a directory into content-hashed chunks and sends only
those the cluster lacks; the ``hfai-storage`` service stages them in a JetStream object store and
writes the workspace into the shared filesystem, scans usage, restricts users over their limit and
moves old files to the gc path. See docs/storage.md.
"""
