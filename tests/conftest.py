"""Shared test settings: offline, and Hypothesis profiles for the fast and slow tiers.

Every Hypothesis test runs derandomized (a fixed seed per test), so no outcome depends on an
unpinned seed; ``HSD_HYPOTHESIS_PROFILE=explore`` turns randomization back on for bug hunting.
"""

import os

from hypothesis import HealthCheck, settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

settings.register_profile(
    "ci", derandomize=True, deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "explore", derandomize=False, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HSD_HYPOTHESIS_PROFILE", "ci"))
