"""The fault and fuzz tier: every module here carries the `fault` marker.

Hypothesis runs deterministically (derandomize: the same examples on every run and machine, so
CI is reproducible) with no example database (nothing written into the repository), a bounded
number of examples per parser, and no per-example deadline of its own: the fuzz tests bound
each call with a real timer (tests/fault/test_fuzz_parsers.py `bounded`), which interrupts a
hang instead of measuring it afterwards.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.configuration import set_hypothesis_home_dir

# Hypothesis keeps caches (constants, Unicode tables) under its home folder even without a
# database: outside the repository.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "ipvs-leftovers-hypothesis")

EXAMPLES = 300

settings.register_profile(
    "fault",
    derandomize=True,
    database=None,
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=False,
)
