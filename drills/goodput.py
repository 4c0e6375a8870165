"""How much of a run's wall time is useful work, given checkpoints and faults.

The drills compare what they measured with what the checkpoint model predicts. The model is
Daly's complete one (Daly 2006), which the first-order Young/Daly interval comes from:

- J. W. Young, "A first order approximation to the optimum checkpoint interval",
  Communications of the ACM 17(9), 1974: τ_opt ≈ √(2·δ·M).
- J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
  Future Generation Computer Systems 22(3), 2006: the expected wall time of a job that needs
  T_s seconds of work, checkpoints every τ seconds of work, takes δ seconds to write a
  checkpoint and R seconds to restart, with faults arriving as a Poisson process of mean time
  between failures M, is

      T_wall = M · e^{R/M} · (e^{(τ+δ)/M} − 1) · T_s / τ

  (eq. 13 there; it counts a checkpoint after every segment, the final one included).

Goodput here is T_s / T_wall: the expected fraction of wall time that ends up in the result.
With no faults (M = ∞) it is τ / (τ + δ), the checkpoint overhead alone.

All times are in seconds. The interval τ is *work* time between checkpoints (the time spent
writing a checkpoint is δ, on top).
"""

from __future__ import annotations

import math
import numbers

from control_plane.placement.cost_model import young_daly_interval_hours


def _check(name: str, value: float, *, positive: bool = False, infinite: bool = False) -> float:
    """`value` as a float, or a ValueError naming the argument and what it must be."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None
    if math.isnan(number):
        raise ValueError(f"{name} is NaN; pass a number of seconds")
    if math.isinf(number) and not infinite:
        raise ValueError(f"{name} must be finite, got {number}")
    if number < 0 or (positive and number == 0):
        need = "greater than 0" if positive else "0 or more"
        raise ValueError(f"{name} must be {need} seconds, got {number}")
    return number


def _log_expm1(x: float) -> float:
    """log(e^x − 1) for x > 0 without overflow for large x."""
    if x > 30.0:
        return x + math.log1p(-math.exp(-x))
    return math.log(math.expm1(x))


def expected_goodput(
    interval_s: float | None,
    checkpoint_s: float,
    mtbf_s: float,
    restart_s: float = 0.0,
    work_s: float | None = None,
) -> float:
    """Expected fraction of wall time that is useful work, by Daly's complete model (see module).

    interval_s:   work seconds between checkpoints (τ); None means no checkpoint but the
                  final one, so a fault redoes the run from the start (τ = work_s, which
                  must then be given). An interval longer than work_s counts as work_s.
    checkpoint_s: seconds to write one checkpoint (δ).
    mtbf_s:       mean seconds between faults (M); math.inf for none, giving τ / (τ + δ).
    restart_s:    seconds from a fault to work resuming, reading the checkpoint included (R).
    work_s:       the run's work (T_s); only needed for interval_s=None. Goodput does not
                  depend on it otherwise (the model's T_s / τ segments all cost the same).
    """
    checkpoint = _check("checkpoint_s", checkpoint_s)
    mtbf = _check("mtbf_s", mtbf_s, positive=True, infinite=True)
    restart = _check("restart_s", restart_s)
    work = None if work_s is None else _check("work_s", work_s, positive=True)
    if interval_s is None:
        if work is None:
            raise ValueError("interval_s=None (checkpoint only at the end) needs work_s, the run's length in seconds of work")
        tau = work
    else:
        tau = _check("interval_s", interval_s, positive=True, infinite=True)
        if work is not None:
            tau = min(tau, work)
    if math.isinf(mtbf):
        return 1.0 if math.isinf(tau) else tau / (tau + checkpoint)
    if math.isinf(tau):
        return 0.0  # never a checkpoint under a finite fault rate: the run never finishes
    # goodput = τ / (M · e^{R/M} · (e^{(τ+δ)/M} − 1)), in logs so that long segments don't overflow.
    log_wall_per_segment = math.log(mtbf) + restart / mtbf + _log_expm1((tau + checkpoint) / mtbf)
    return math.exp(math.log(tau) - log_wall_per_segment)


def young_daly_interval(checkpoint_s: float, mtbf_s: float) -> float:
    """The Young/Daly checkpoint interval √(2·δ·M) in seconds of work (M once δ ≥ 2M; ∞ for M = ∞).

    The same formula the placement cost model uses (`cost_model.young_daly_interval_hours`).
    """
    checkpoint = _check("checkpoint_s", checkpoint_s)
    mtbf = _check("mtbf_s", mtbf_s, positive=True, infinite=True)
    if math.isinf(mtbf):
        return math.inf
    return 3600.0 * young_daly_interval_hours(checkpoint / 3600.0, mtbf / 3600.0)


def optimum_goodput(checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0) -> tuple[float, float]:
    """(interval_s, goodput) at the Young/Daly interval: what the best fixed cadence should reach.

    With free checkpoints (δ = 0) the interval is 0 and the goodput its limit e^{−R/M}; with no
    faults (M = ∞) the interval is ∞ and the goodput 1.
    """
    checkpoint = _check("checkpoint_s", checkpoint_s)
    mtbf = _check("mtbf_s", mtbf_s, positive=True, infinite=True)
    restart = _check("restart_s", restart_s)
    interval = young_daly_interval(checkpoint, mtbf)
    if math.isinf(interval):
        return interval, 1.0
    if interval == 0.0:
        return 0.0, math.exp(-restart / mtbf)
    return interval, expected_goodput(interval, checkpoint, mtbf, restart)


def loss_bound_steps(checkpoint_every_steps: int, notice: bool) -> int:
    """The most steps one fault can make a run redo, given its checkpoint cadence.

    With notice (a preemption that sends SIGTERM first) the workload writes a checkpoint at the
    end of the step it is in, so nothing is redone: 0. Without notice the worst case is dying
    just before the next checkpoint is written, after `checkpoint_every_steps` steps whose work
    is in no checkpoint: those are redone.
    """
    if isinstance(checkpoint_every_steps, bool) or not isinstance(checkpoint_every_steps, numbers.Integral):
        raise ValueError(f"checkpoint_every_steps must be a whole number of steps, got {checkpoint_every_steps!r}")
    if checkpoint_every_steps < 1:
        raise ValueError(f"checkpoint_every_steps must be 1 or more, got {checkpoint_every_steps}")
    return 0 if notice else int(checkpoint_every_steps)
