"""Success rates with their uncertainty."""

from __future__ import annotations

from statsmodels.stats.proportion import proportion_confint


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a success rate (well-behaved at 0, 1 and small n)."""
    if trials <= 0:
        return 0.0, 1.0
    low, high = proportion_confint(successes, trials, alpha=1 - confidence, method="wilson")
    return float(low), float(high)
