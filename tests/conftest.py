"""Shared test configuration: hypothesis profiles.

``ci`` (the default) is fast and derandomized, so a CI run is reproducible; ``thorough`` runs
many more random examples::

    HYPOTHESIS_PROFILE=thorough python -m pytest tests
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=12,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=300,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
