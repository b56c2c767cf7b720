"""ipvs-leftovers: audit and safely clean up what kube-proxy's ipvs mode left on a node."""

__version__ = "0.1.0"
# Every metric the agent exports starts with this: the views' and the auto-cleanup's.
METRIC_PREFIX = "ipvs_leftovers_"
