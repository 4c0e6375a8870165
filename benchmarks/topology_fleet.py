"""Figure 16: topology-aware against topology-blind gang placement on a simulated fleet of NVLink
racks: step time by the all-reduce model, and what the same work costs.

The fleet: eight GB200 NVL72 racks, 8 × 18 nodes × 4 GPUs = 576 GPUs, one pool of the catalog
(`nodes_per_domain: 18`, `topology: {domain: nvlink}`), so its links are the catalog's: NVLink
1,800 GB/s per GPU inside a rack (`ACCELERATORS["gb200"]`), 50 GB/s per GPU between racks
(`DEFAULT_CROSS_DOMAIN_GB_PER_S`, 400 Gb/s InfiniBand). $6 per GPU-hour, illustrative.

The work: a seeded week of data-parallel training gangs (`workload`): 2–36 nodes (8–144 GPUs),
half of them up to 8 nodes, a third 9–18 (up to a whole rack), the rest 19–36 (more than a
rack); each trains a model of 1–70 B parameters (log-uniform), all-reducing 2 bytes per
parameter each step (`allreduce_gb`), after `compute_seconds_per_step` of compute (6 × params ×
tokens per GPU per step (4k, 8k or 16k) at 40% of a GB200's 2.5 PFLOPS dense BF16), for 1–24 h
of steps at the one-rack step time (log-uniform). Each gang says whether it may span racks
(`span_domains`): 85% of those bigger than a rack, half of the others. Every gang is planned by
the product's `plan_placement`: those bigger than a rack that may not span are refused there,
with its reason, and reach no scheduler. The work is scaled so the offered load (GPU-hours at
the one-rack step time over the fleet's week) is each of `LOADS`.

The same gangs run under each policy of `benchmarks/topology_sim.py` (blind, aware,
aware-nowait) until all have ended. Reported side by side: the share of gangs split (and split
against their spec), mean and p95 step-time slowdown against the one-rack ideal, GPU-hours of
useful work (at the one-rack step time: the same under every policy) and GPU-hours held, their
cost and its difference from blind in $ and %, mean and p95 wait, gangs done within the week,
makespan, and the wall time of each simulation.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from rich.table import Table

from benchmarks.topology_sim import POLICIES, Gang, Simulation
from benchmarks.tables import print_tables
from control_plane.catalog.pools import Pool
from control_plane.catalog.step_spec import StepSpec
from control_plane.placement.links import allreduce_seconds
from control_plane.placement.ranking import plan_placement

WEEK = 168.0
SEED = 16
T0 = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)
RACKS, NODES_PER_RACK, GPUS_PER_NODE = 8, 18, 4
PRICE = 6.0  # $ per GPU-hour, illustrative
GANGS = 300  # arriving over the week
SEEDS = 10  # seeded weeks for the spread of the differences
LOADS = {"busy": 0.85, "heavy": 1.0}  # offered GPU-hours (one-rack step time) over the fleet's week
FLOPS = 2.5e15 * 0.4  # a GB200's dense BF16 at 40% model FLOPs utilisation
SIZES = {"≤ 8 nodes": (2, 8, 0.5), "9–18 nodes": (9, 18, 0.33), "19–36 nodes": (19, 36, 0.17)}  # low, high, share
SPAN = {"small": 0.5, "big": 0.85}  # the share that may span: up to a rack, bigger than a rack


def fleet() -> Pool:
    return Pool(
        name="gb200-nvl72", provider="coreweave", region="us-east-04", backend="slurm", backend_settings={"partition": "gpu"},
        purchasing="on_demand", accelerator="gb200", gpus_per_node=GPUS_PER_NODE, nodes=RACKS * NODES_PER_RACK,
        nodes_per_domain=NODES_PER_RACK, topology={"domain": "nvlink"}, price_per_gpu_hour=PRICE, price_source="illustrative", qualify=False,
    )  # fmt: skip


@dataclass(frozen=True)
class Drawn:
    """One gang as drawn, before its work is scaled to a load."""

    arrival: float
    nodes: int
    span: bool
    params_b: float
    tokens: int
    hours: float  # of steps at the one-rack step time


def draw(rng: np.random.Generator, count: int = GANGS) -> list[Drawn]:
    out = []
    bands = list(SIZES.values())
    for arrival in np.sort(rng.uniform(0, WEEK, count)):
        low, high, _ = bands[int(rng.choice(len(bands), p=[b[2] for b in bands]))]
        nodes = int(rng.integers(low, high + 1))
        span = bool(rng.random() < SPAN["big" if nodes > NODES_PER_RACK else "small"])
        out.append(Drawn(float(arrival), nodes, span, float(np.exp(rng.uniform(np.log(1), np.log(70)))), int(rng.choice([4096, 8192, 16384])),
                         float(np.exp(rng.uniform(np.log(1), np.log(24))))))  # fmt: skip
    return out


def spec(k: int, d: Drawn) -> StepSpec:
    """The gang as a step of the product: what the planner sees."""
    return StepSpec(
        name=f"fleet.gang-{k}", entry_point="workload_runtime.noop", tenant="cell", gpus=d.nodes * GPUS_PER_NODE, nodes=d.nodes,
        ranks_per_node=GPUS_PER_NODE, tightly_coupled=True, span_domains=d.span, allreduce_gb=2.0 * d.params_b,
        compute_seconds_per_step=6 * d.params_b * 1e9 * d.tokens / FLOPS, expected_hours=d.hours, start=T0,
    )  # fmt: skip


def planned(drawn: list[Drawn], pool: Pool) -> list[str | None]:
    """Per gang, the planner's refusal of the pool (its reasons, joined), or None where it may run."""
    out = []
    for k, d in enumerate(drawn):
        verdict = plan_placement(spec(k, d), {pool.name: pool}, at=T0).verdict(pool.name)
        out.append(None if verdict.feasible else "; ".join(verdict.reasons))
    return out


def gangs(drawn: list[Drawn], refusals: list[str | None], pool: Pool, load: float) -> list[Gang]:
    """The gangs with their work scaled so the planned ones offer `load` of the fleet's week."""
    inside, cross = pool.link_gb_per_s
    specs = [spec(k, d) for k, d in enumerate(drawn)]
    one = [s.compute_seconds_per_step + allreduce_seconds(s.allreduce_gb, [s.gpus], inside, cross) for s in specs]  # type: ignore[operator]
    offered = sum(s.gpus * d.hours for s, d, why in zip(specs, drawn, refusals, strict=True) if why is None)
    scale = load * pool.total_gpus * WEEK / offered
    return [
        Gang(f"gang-{k}", d.arrival, d.nodes, GPUS_PER_NODE, d.span, s.allreduce_gb, s.compute_seconds_per_step,  # type: ignore[arg-type]
             max(1, round(d.hours * scale * 3600 / t)), refused=why)
        for k, (d, s, t, why) in enumerate(zip(drawn, specs, one, refusals, strict=True))
    ]  # fmt: skip


@dataclass
class PolicyResult:
    load: str
    offered: float
    policy: str
    gangs: int
    refused: int
    split_share: float  # of the gangs run, those over more than one rack
    split_against_spec: int  # split though their spec says one rack (`span_domains: false`)
    slowdown_mean: float  # step time over the one-rack step time, per gang
    slowdown_p95: float
    useful_gpu_h: float
    held_gpu_h: float
    cost_usd: float
    wait_mean_h: float
    wait_p95_h: float
    done_in_week: int
    makespan_h: float
    by_size: dict[str, dict[str, float]]  # size band -> split share, mean slowdown, mean wait
    wall_s: float


def measure(sim: Simulation, load: str, offered: float, wall_s: float) -> PolicyResult:
    refused = [g for g in sim.gangs.values() if g.refused is not None]
    ran = [g for g in sim.gangs.values() if g.refused is None]
    if any(g.finish is None for g in ran):
        raise RuntimeError(f"{sim.policy}: {sum(g.finish is None for g in ran)} planned gangs never ran")
    slow = np.array([g.split.slowdown for g in ran])  # type: ignore[union-attr]
    wait = np.array([g.start - g.arrival for g in ran])  # type: ignore[operator]
    split = np.array([len(g.racks) > 1 for g in ran])
    held = sum(g.held_gpu_hours for g in ran)
    by_size = {}
    for band, (low, high, _) in SIZES.items():
        inside = np.array([low <= g.nodes <= high for g in ran])
        by_size[band] = {"gangs": int(inside.sum()), "split_share": float(split[inside].mean()), "slowdown_mean": float(slow[inside].mean()),
                         "wait_mean_h": float(wait[inside].mean())}  # fmt: skip
    return PolicyResult(
        load=load, offered=offered, policy=sim.policy, gangs=len(ran), refused=len(refused), split_share=float(split.mean()),
        split_against_spec=sum(len(g.racks) > 1 and not g.span for g in ran), slowdown_mean=float(slow.mean()),
        slowdown_p95=float(np.percentile(slow, 95)), useful_gpu_h=sum(g.useful_gpu_hours for g in ran), held_gpu_h=held,
        cost_usd=held * PRICE, wait_mean_h=float(wait.mean()), wait_p95_h=float(np.percentile(wait, 95)),
        done_in_week=sum(g.finish <= WEEK for g in ran), makespan_h=max(g.finish for g in ran), by_size=by_size, wall_s=wall_s,  # type: ignore[operator, type-var]
    )  # fmt: skip


def week(seed: int, pool: Pool, count: int = GANGS, loads: dict[str, float] | None = None) -> tuple[list[PolicyResult], list[str | None], float]:
    """One seeded week: every load × policy on the same gangs; and the planner's refusals, and its time."""
    inside, cross = pool.link_gb_per_s
    drawn = draw(np.random.default_rng(seed), count)
    started = time.perf_counter()
    refusals = planned(drawn, pool)
    plan_s = time.perf_counter() - started
    results = []
    for load, offered in (loads or LOADS).items():  # the same gangs, each one's steps scaled
        stream = gangs(drawn, refusals, pool, offered)
        for policy in POLICIES:
            started = time.perf_counter()
            sim = Simulation(policy, RACKS, NODES_PER_RACK, inside, cross, [_fresh(g) for g in stream]).run()
            results.append(measure(sim, load, offered, time.perf_counter() - started))
    return results, refusals, plan_s


def run(count: int = GANGS, loads: dict[str, float] | None = None, seeds: int = SEEDS) -> dict[str, Any]:
    """The figure's week (`SEED`), then the same over `seeds` seeded weeks (it and the next ones): each
    policy against blind, per week."""
    pool = fleet()
    inside, cross = pool.link_gb_per_s
    results, refusals, plan_s = week(SEED, pool, count, loads)
    reasons = sorted({why for why in refusals if why})
    weeks: dict[str, dict[str, dict[str, list[float]]]] = {}
    for k in range(seeds):
        rows = results if k == 0 else week(SEED + k, pool, count, loads)[0]
        blind = {r.load: r for r in rows if r.policy == "blind"}
        for r in rows:
            b = blind[r.load]
            into = weeks.setdefault(r.load, {}).setdefault(r.policy, {"cost_vs_blind": [], "wait_mean_vs_blind_h": [], "slowdown_mean": [], "split_share": []})
            into["cost_vs_blind"].append(r.cost_usd / b.cost_usd - 1)
            into["wait_mean_vs_blind_h"].append(r.wait_mean_h - b.wait_mean_h)
            into["slowdown_mean"].append(r.slowdown_mean)
            into["split_share"].append(r.split_share)
    return {
        "fleet": {"pool": pool.name, "racks": RACKS, "nodes_per_rack": NODES_PER_RACK, "gpus_per_node": GPUS_PER_NODE, "gpus": pool.total_gpus,
                  "inside_gb_per_s": inside, "cross_gb_per_s": cross, "usd_per_gpu_hour": PRICE, "price": "illustrative",
                  "gangs": count, "refused": sum(w is not None for w in refusals), "refusal_example": reasons[0] if reasons else None,
                  "plan_s": plan_s, "seed": SEED},  # fmt: skip
        "policies": [asdict(r) for r in results],
        "seeds": {"seeds": list(range(SEED, SEED + seeds)), "weeks": weeks},
    }


def _fresh(g: Gang) -> Gang:
    return Gang(g.id, g.arrival, g.nodes, g.gpus_per_node, g.span, g.allreduce_gb, g.compute_seconds, g.steps, g.refused)


def tables(result: dict[str, Any]) -> list[Table]:
    f = result["fleet"]
    main = Table(title=f"Figure 16: topology-aware against topology-blind gang placement, {f['racks']} NVL72 racks × {f['nodes_per_rack']} nodes × "
                 f"{f['gpus_per_node']} GPUs ({f['gpus']} GPUs), {f['gangs']} gangs over a simulated week ({f['refused']} refused by the planner)",
                 title_justify="left",
                 caption=f"step time by the all-reduce model (placement/links.py): {f['inside_gb_per_s']:g} GB/s per GPU inside a rack, "
                 f"{f['cross_gb_per_s']:g} GB/s per GPU between racks; slowdown against the same gang in one (big enough) rack; useful: GPU-hours at "
                 f"that one-rack step time; cost: GPU-hours held × ${f['usd_per_gpu_hour']:g} (illustrative); Δ: against blind in the same run",
                 caption_justify="left")  # fmt: skip
    for column in ("Load", "Policy", "Split", "Split vs spec", "Slowdown mean / p95", "Useful GPU-h", "Held GPU-h", "Cost $", "Δ cost vs blind",
                   "Wait mean / p95 h", "Done in week", "Makespan h", "Sim s"):  # fmt: skip
        main.add_column(column, justify="left" if column in ("Load", "Policy") else "right")
    blind = {r["load"]: r for r in result["policies"] if r["policy"] == "blind"}
    for r in result["policies"]:
        b = blind[r["load"]]
        delta = "—" if r is b else f"{r['cost_usd'] - b['cost_usd']:+,.0f} ({(r['cost_usd'] - b['cost_usd']) / b['cost_usd']:+.1%})"
        main.add_row(f"{r['load']} ({r['offered']:.2f})" if r is b else "", r["policy"], f"{r['split_share']:.0%}", str(r["split_against_spec"]),
                     f"{r['slowdown_mean']:.3f} / {r['slowdown_p95']:.3f}", f"{r['useful_gpu_h']:,.0f}", f"{r['held_gpu_h']:,.0f}",
                     f"{r['cost_usd']:,.0f}", delta, f"{r['wait_mean_h']:.1f} / {r['wait_p95_h']:.1f}", f"{r['done_in_week']} / {r['gangs']}",
                     f"{r['makespan_h']:.0f}", f"{r['wall_s']:.2f}")  # fmt: skip
    sizes = Table(title="Figure 16: by gang size — share split, mean slowdown, mean wait (h)", title_justify="left")
    bands = list(result["policies"][0]["by_size"])
    for column in ("Load", "Policy", *bands):
        sizes.add_column(column, justify="left" if column in ("Load", "Policy") else "right")
    for r in result["policies"]:
        sizes.add_row(r["load"] if r["policy"] == POLICIES[0] else "", r["policy"],
                      *(f"{s['split_share']:.0%} · {s['slowdown_mean']:.3f} · {s['wait_mean_h']:.1f}  (n={s['gangs']})" for s in r["by_size"].values()))  # fmt: skip
    w = result["seeds"]
    seeds = Table(title=f"Figure 16: against blind over {len(w['seeds'])} seeded weeks (seeds {w['seeds'][0]}–{w['seeds'][-1]}): median (min … max)",
                  title_justify="left", caption="cost: GPU-hours held × price, against blind's on the same week; wait: mean wait minus blind's", caption_justify="left")  # fmt: skip
    for column in ("Load", "Policy", "Cost vs blind", "Mean wait vs blind h", "Slowdown mean", "Split"):
        seeds.add_column(column, justify="left" if column in ("Load", "Policy") else "right")

    def spread(values: list[float], fmt: str) -> str:
        return f"{format(float(np.median(values)), fmt)} ({format(min(values), fmt)} … {format(max(values), fmt)})"

    for load, policies in w["weeks"].items():
        for policy, v in policies.items():
            seeds.add_row(load if policy == POLICIES[0] else "", policy, "—" if policy == "blind" else spread(v["cost_vs_blind"], "+.1%"),
                          "—" if policy == "blind" else spread(v["wait_mean_vs_blind_h"], "+.1f"), spread(v["slowdown_mean"], ".3f"),
                          spread(v["split_share"], ".0%"))  # fmt: skip
    return [main, sizes, seeds]


def main() -> None:
    print_tables(tables(run()))


if __name__ == "__main__":
    main()
