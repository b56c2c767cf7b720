"""ipvs-leftovers: audit and safely clean up what kube-proxy's ipvs mode left on a node."""

__version__ = "0.1.0"
