"""The policy version by version: what it learnt from, its success in simulation and on the real
robot (each with its 95% Wilson interval), and whether real success rose, read from the instance.

`robotics/real_robot_evaluation` plots it in its metadata; `sinewgrid summary` prints it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import dagster as dg
from matplotlib.figure import Figure

POLICY = dg.AssetKey(["robotics", "policy"])
SIM_EVALUATION = dg.AssetKey(["robotics", "sim_evaluation"])
REAL_EVALUATION = dg.AssetKey(["robotics", "real_robot_evaluation"])


@dataclass(frozen=True)
class Rate:
    """A success rate over ``trials`` with its 95% Wilson interval."""

    rate: float
    low: float
    high: float
    trials: int

    def __str__(self) -> str:
        return f"{self.rate:.0%} [{self.low:.0%}–{self.high:.0%}] of {self.trials}"


@dataclass
class PolicyVersion:
    number: int  # 1 for the first version trained
    policy_version: str
    datasets: int | None = None
    corrective_episodes: int | None = None  # episodes of relabelling sessions it learnt from
    sim: Rate | None = None
    real: Rate | None = None
    failed_real_trials: int | None = None

    @property
    def label(self) -> str:
        return f"v{self.number} {self.policy_version[:8]}"


def _value(metadata: dict, key: str):
    entry = metadata.get(key)
    return getattr(entry, "value", entry)


def _rate(metadata: dict, prefix: str = "") -> Rate:
    return Rate(*(float(_value(metadata, f"{prefix}{k}")) for k in ("success_rate", "ci95_low", "ci95_high")), int(_value(metadata, f"{prefix}trials")))


def _records(instance: dg.DagsterInstance, key: dg.AssetKey) -> list:
    return instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=1000, ascending=True).records


def policy_versions(instance: dg.DagsterInstance, evaluated: dict | None = None) -> list[PolicyVersion]:
    """Every policy version in the order it was trained, with its newest evaluations.
    ``evaluated``: the metadata of a real-robot evaluation not yet in the instance (the asset's own)."""
    rows: dict[str, PolicyVersion] = {}

    def row(version: str) -> PolicyVersion:
        return rows.setdefault(version, PolicyVersion(number=len(rows) + 1, policy_version=version))

    for record in _records(instance, POLICY):
        md = record.asset_materialization.metadata
        version = row(str(_value(md, "policy_version")))
        version.datasets, version.corrective_episodes = _value(md, "datasets"), _value(md, "corrective_episodes")
    for record in _records(instance, SIM_EVALUATION):
        md = record.asset_materialization.metadata
        row(str(_value(md, "policy_version"))).sim = _rate(md)
    real = [r.asset_materialization.metadata for r in _records(instance, REAL_EVALUATION)]
    for md in [*real, *([evaluated] if evaluated else [])]:
        if _value(md, "status") == "valid":
            version = row(str(_value(md, "policy_version")))
            version.real, version.failed_real_trials = _rate(md, "real_"), int(_value(md, "failed_trials_flagged_for_relabelling"))
    return list(rows.values())


def verdict(versions: list[PolicyVersion]) -> str:
    """One sentence: did real success rise from the first version evaluated on the real robot to
    the last, and when it did not, why."""
    real = [v for v in versions if v.real is not None]
    if len(real) < 2:
        return (
            "Only one policy version has been evaluated on the real robot so far: run another round (`make demo` again) "
            "to see whether the corrective demonstrations raise real success."
            if real else "No policy version has been evaluated on the real robot yet."
        )
    first, last = real[0], real[-1]
    change = f"from {first.real} ({first.label}) to {last.real} ({last.label})"
    if last.real.low > first.real.high:
        return f"Real success rose {change}, after {last.corrective_episodes} corrective episodes on the real robot; the 95% intervals do not overlap."
    if first.failed_real_trials == 0:
        return f"Real success did not rise {change}: {first.label} failed no trial, so there was nothing to relabel."
    if not last.corrective_episodes:
        return f"Real success did not rise {change}: {last.label} learnt from no corrective demonstrations (none had been ingested when it trained)."
    if last.real.rate > first.real.rate:
        return f"Real success rose {change}, but the 95% intervals overlap: more trials per task would tell whether the corrective demonstrations helped."
    return f"Real success did not rise {change}, although {last.label} learnt from {last.corrective_episodes} corrective episodes: the gap is not one they teach."


def success_chart_png(versions: list[PolicyVersion]) -> bytes:
    """Sim and real success per policy version, with 95% intervals as error bars, as PNG bytes."""
    figure = Figure(figsize=(8, 4.2))
    axes = figure.add_subplot()
    positions = range(len(versions))
    for where, offset, colour in (("sim", -0.08, "tab:blue"), ("real", 0.08, "tab:orange")):
        shown = [(i + offset, getattr(v, where)) for i, v in zip(positions, versions, strict=True) if getattr(v, where) is not None]
        if shown:
            x, rates = zip(*shown, strict=True)
            errors = [[r.rate - r.low for r in rates], [r.high - r.rate for r in rates]]
            axes.errorbar(x, [r.rate for r in rates], yerr=errors, fmt="o-", capsize=4, color=colour, label=f"{where} success (95% interval)")
    axes.set_xticks(list(positions), [v.label for v in versions], fontsize=8)
    axes.set_ylim(-0.03, 1.05)
    axes.set_ylabel("success rate")
    axes.set_title("Success by policy version", fontsize=11)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return buffer.getvalue()


def versions_markdown(versions: list[PolicyVersion]) -> str:
    """The same figures as a markdown table."""
    lines = ["| policy | corrective episodes | sim success | real success |", "|---|---:|---:|---:|"]
    for v in versions:
        lines.append(f"| {v.label} | {v.corrective_episodes if v.corrective_episodes is not None else '—'} | {v.sim or '—'} | {v.real or 'pending'} |")
    return "\n".join(lines)
