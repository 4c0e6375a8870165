"""Preemption traces: interruption times drawn from a rate, for the drills' trace mode.

Where the rate comes from. AWS publishes, in its Spot Instance Advisor, how often each
instance type in each region was interrupted, in bands of "share of instances interrupted per
month": <5%, 5-10%, 10-15%, 15-20%, >20%. `SPOT_BANDS` holds those bands; `rate_for` turns
one into a rate per hour by reading the band at its upper edge (25% for ">20%") as the chance
p that one instance is interrupted within a month of 730 hours, and assuming interruptions
arrive as a Poisson process: λ = −ln(1 − p) / 730 per hour. That is *our reading* of a
published band, a worst case inside it, not a rate any provider states.

How a drill replays it. Such rates mean one interruption every few months; a drill runs for
minutes. So the trace mode keeps the *shape* — interruptions arriving as a Poisson process,
independent of the run's state — and replays it at a rate scaled up (`accelerate`,
`acceleration_for`) so that a short run sees a handful of interruptions. The report states
both the published rate and the replayed one. The checkpoint cadences it compares are sized
for the replayed rate, since that is the rate the run actually sees.
"""

from __future__ import annotations

import math

import numpy as np

HOURS_PER_MONTH = 730.0

# Spot Instance Advisor band → the share of instances interrupted per month we read it as
# (the band's upper edge; ">20%" has none, so 25%).
SPOT_BANDS: dict[str, float] = {
    "<5%": 0.05,
    "5-10%": 0.10,
    "10-15%": 0.15,
    "15-20%": 0.20,
    ">20%": 0.25,
}

_MAX_EXPECTED_FAULTS = 1_000_000  # more than this in one trace is a units mistake, not a drill


def band_rate_per_hour(band: str) -> float:
    """Interruptions per hour for a Spot Instance Advisor band: −ln(1 − p) / 730, p its upper edge."""
    if band not in SPOT_BANDS:
        raise ValueError(f"unknown spot interruption band {band!r}; known bands: {', '.join(SPOT_BANDS)}")
    return -math.log1p(-SPOT_BANDS[band]) / HOURS_PER_MONTH


def rate_for(band_or_rate: str | float) -> tuple[float, str]:
    """(interruptions per hour, where that number comes from) for a band name or a rate.

    Accepts a `SPOT_BANDS` name ("<5%" … ">20%"), a number of interruptions per hour, or a
    string holding such a number (as a command line passes it). Raises ValueError for anything
    else, listing the known bands.
    """
    if isinstance(band_or_rate, str):
        text = band_or_rate.strip().replace(" ", "")
        if text in SPOT_BANDS:
            rate = band_rate_per_hour(text)
            return rate, (
                f"AWS Spot Instance Advisor band {text} of instances interrupted per month, read as "
                f"{SPOT_BANDS[text]:.0%} per month (Poisson, {HOURS_PER_MONTH:.0f} h/month): "
                f"{rate:.3g} interruptions per hour, one every {format_hours(1.0 / rate)}"
            )
        try:
            number = float(text)
        except ValueError:
            raise ValueError(
                f"{band_or_rate!r} is neither a spot interruption band nor a rate per hour; "
                f"known bands: {', '.join(SPOT_BANDS)}; or give interruptions per hour, e.g. 0.5"
            ) from None
    elif isinstance(band_or_rate, (int, float)) and not isinstance(band_or_rate, bool):
        number = float(band_or_rate)
    else:
        raise ValueError(f"expected a band ({', '.join(SPOT_BANDS)}) or interruptions per hour, got {band_or_rate!r}")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"an interruption rate must be a finite number per hour, 0 or more; got {number}")
    if number == 0:
        return 0.0, "no interruptions (rate 0 per hour, given)"
    return number, f"{number:.3g} interruptions per hour (given), one every {format_hours(1.0 / number)}"


def published_rate_of(band: str) -> float | None:
    """The published rate per hour behind a `TraceResult.band` text, when it names one.

    The band text may be a band name, a number, or a description `rate_for` wrote (which names
    its band); None when none of these.
    """
    try:
        return rate_for(band)[0]
    except ValueError:
        pass
    named = [name for name in SPOT_BANDS if name in band]
    return band_rate_per_hour(named[0]) if len(named) == 1 else None


def draw_trace(rate_per_hour: float, horizon_s: float, seed: int, max_faults: int | None = None) -> list[float]:
    """Interruption times, in seconds since the start, of a Poisson process over [0, horizon_s).

    Gaps between interruptions are exponential with mean 3600 / rate_per_hour, drawn from
    `numpy.random.default_rng(seed)`: the same arguments give the same trace, and a longer
    horizon (or a larger max_faults) only adds interruptions after those of a shorter one.
    max_faults keeps the first that many.
    """
    rate = float(rate_per_hour)
    horizon = float(horizon_s)
    if not math.isfinite(rate) or rate < 0:
        raise ValueError(f"rate_per_hour must be a finite number, 0 or more; got {rate_per_hour!r}")
    if not math.isfinite(horizon) or horizon < 0:
        raise ValueError(f"horizon_s must be a finite number of seconds, 0 or more; got {horizon_s!r}")
    if max_faults is not None and max_faults < 0:
        raise ValueError(f"max_faults must be 0 or more (or None for no limit), got {max_faults}")
    expected = rate * horizon / 3600.0
    if expected > _MAX_EXPECTED_FAULTS:
        raise ValueError(
            f"{rate} per hour over {horizon} s is {expected:,.0f} expected interruptions; "
            "check the units (rate per hour, horizon in seconds)"
        )
    limit = math.inf if max_faults is None else max_faults
    if rate == 0 or limit == 0:
        return []
    rng = np.random.default_rng(seed)
    mean_gap = 3600.0 / rate
    times: list[float] = []
    now = 0.0
    while len(times) < limit:
        for gap in rng.exponential(mean_gap, size=64):  # fixed chunks keep longer traces extensions of shorter ones
            now += float(gap)
            if now >= horizon or len(times) >= limit:
                return times
            times.append(now)
    return times


def accelerate(rate_per_hour: float, factor: float) -> float:
    """The replayed rate: the published one times `factor` (time compressed `factor` times)."""
    rate, speed = float(rate_per_hour), float(factor)
    if not math.isfinite(rate) or rate < 0:
        raise ValueError(f"rate_per_hour must be a finite number, 0 or more; got {rate_per_hour!r}")
    if not math.isfinite(speed) or speed <= 0:
        raise ValueError(f"factor must be a finite number greater than 0; got {factor!r}")
    return rate * speed


def acceleration_for(rate_per_hour: float, horizon_s: float, expected_faults: float) -> float:
    """The factor that makes a run of horizon_s seconds expect `expected_faults` interruptions."""
    rate, horizon, faults = float(rate_per_hour), float(horizon_s), float(expected_faults)
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"rate_per_hour must be greater than 0 to be scaled; got {rate_per_hour!r}")
    if not math.isfinite(horizon) or horizon <= 0:
        raise ValueError(f"horizon_s must be greater than 0 seconds; got {horizon_s!r}")
    if not math.isfinite(faults) or faults <= 0:
        raise ValueError(f"expected_faults must be greater than 0; got {expected_faults!r}")
    return faults / (rate * horizon / 3600.0)


def format_hours(hours: float) -> str:
    """A duration in hours in words a person reads at a glance: days, hours, minutes or seconds."""
    if hours >= 48:
        return f"{hours / 24:,.0f} days"
    if hours >= 1:
        return f"{hours:.1f} h"
    seconds = hours * 3600
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"
