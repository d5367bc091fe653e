"""The target of hypothesis's entry point: registers (does not load) the ``causalab`` profile.

Its own module, importing nothing of ours: hypothesis loads its entry points
while ``import hypothesis`` is still running, so a target that itself imports
hypothesis at module level (as ``strategies`` must) would be loaded half-made
whenever ``strategies`` is the first thing a program imports.
"""

PROFILE = "causalab"


def setup() -> None:
    from hypothesis import HealthCheck, settings  # defined by the time hypothesis runs its hooks

    settings.register_profile(PROFILE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
