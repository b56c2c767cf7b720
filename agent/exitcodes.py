"""Exit codes. Documented in docs/exit-codes.md."""

OK = 0
REMAINS = 1  # ipvs-mode objects present (audit) / something remains (cleanup) / check failed
USAGE = 2  # click's usage errors
REFUSED = 3  # the gate (docs/contract.md#the-cleanup-gate) refused a cleanup
ERROR = 4  # a source could not be read, or the agent may not read it
# cleanup refused: connections still live through virtual servers it would delete (nothing
# changed; docs/contract.md#live-connections)
LIVE_CONNECTIONS = 5
