"""What runs off the node: the operator's commands that read the cluster (`job-manifest`'s
DaemonSet lookup, `fleet status`, `fleet step`).

Nothing here is imported by the node agent's commands (audit, serve, cleanup, restore, the
checks): the Kubernetes client is an optional extra (`pip install 'ipvs-leftovers[fleet]'`),
imported only inside the functions that talk to the API server
(tests/unit/test_fleet_imports.py).
"""
