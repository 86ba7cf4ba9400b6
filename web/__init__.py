"""hfai-web: the task-management pages (jobs, nodes, cluster, usage) over the normal API; see docs/web.md."""
