"""Figure 15: queues and fair share on a simulated week of a 2,240-GPU fleet.

Twelve pools across purchasing modes (a block, four reserved clusters, three on-demand, four
spot), four teams with nominal quotas on each pool (the Cell lane, two labs, the Robotics lane)
in one cohort, and a week of ~10,000 jobs with the lanes' own shapes: three 256-GPU pretraining
gangs, lab fine-tune bursts in lab hours, nightly simulation sweeps, policy-training gangs and
deadline-bound real-robot evaluations; plus a spot-interruption trace. The same jobs and the
same trace run under three policies (benchmarks/queue_sim.py), each job placed by the product's
planner and admitted by the product's admission:

- **queues**: Sinewgrid's quotas, cohort lending and reclaim, priority classes, fair-share order,
  and work moved onto committed capacity that comes free (`moves.py`, with more than
  `SINEWGRID_QUEUE_MOVE_MIN_HOURS`'s default of its run left);
- **strict**: the same quotas without a cohort (no lending, no borrowing);
- **fifo**: one queue in arrival order, no quotas or priorities, nothing overtakes the oldest.

Reported side by side: reserved utilisation (GPU-hours held on reserved and block pools over
what they have), each team's GPU-hours against its fair share (the weighted max-min split of all
GPU-hours held that week, capped at what the team asked for) and Jain's index over those ratios,
p50/p99 wait per priority class (jobs still waiting at the week's end count with their wait so
far: a lower bound), goodput (work kept over GPU-hours held), cost (reserved capacity is paid
whether used or not; on-demand and spot by the hour used), and the wall time of each simulated
week. Then the admission decision time per step at this scale: `queues_now` from the in-flight
records of 600 running jobs, and `PoolQueue.decide` over a step's ranked pools.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from rich.table import Table

from benchmarks.queue_sim import POLICIES, Interruption, Job, Simulation
from benchmarks.tables import print_tables
from control_plane.catalog.pools import Pool, Purchasing
from control_plane.catalog.quotas import Quotas
from control_plane.catalog.step_spec import StepSpec
from control_plane.placement.ranking import plan_placement
from control_plane.queues.moves import COMMITTED
from control_plane.queues.requests import held_gpus
from control_plane.settings import PlatformSettings

WEEK = 168.0
SEED = 33
T0 = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)  # a Monday, 00:00
RESERVED = tuple(COMMITTED)
MOVE_MIN_HOURS = PlatformSettings.model_fields["queue_move_min_hours"].default  # SINEWGRID_QUEUE_MOVE_MIN_HOURS's default
NOTICE_HOURS = {"aws": 2 / 60, "gcp": 0.5 / 60, "azure": 0.5 / 60, "anyscale": 2 / 60}

# name: (provider, region, backend, purchasing, accelerator, gpus per node, nodes, $/GPU-hour, interruptions per node-hour)
FLEET: dict[str, tuple] = {
    "aws-p5-block": ("aws", "us-east-1", "slurm", Purchasing.block, "h100-80gb", 8, 64, 3.90, 0.0),
    "gcp-a3-reserved": ("gcp", "us-central1", "kubernetes", Purchasing.reserved, "h100-80gb", 8, 32, 3.60, 0.0),
    "azure-nd-reserved": ("azure", "eastus", "kubernetes", Purchasing.reserved, "h100-80gb", 8, 32, 3.80, 0.0),
    "coreweave-reserved": ("coreweave", "us-east-04", "slurm", Purchasing.reserved, "h100-80gb", 8, 32, 3.10, 0.0),
    "onprem-a100": ("onprem", "lab-dc", "slurm", Purchasing.reserved, "a100-80gb", 8, 32, 1.20, 0.0),
    "lambda-h100-ondemand": ("lambda", "us-east-1", "kubernetes", Purchasing.on_demand, "h100-80gb", 8, 16, 2.99, 0.0),
    "aws-p5-ondemand": ("aws", "us-east-1", "kubernetes", Purchasing.on_demand, "h100-80gb", 8, 16, 6.90, 0.0),
    "gcp-a3-ondemand": ("gcp", "us-central1", "kubernetes", Purchasing.on_demand, "h100-80gb", 8, 8, 8.00, 0.0),
    "aws-g6e-spot": ("aws", "us-east-1", "kubernetes", Purchasing.spot, "l40s", 4, 32, 0.95, 0.02),
    "gcp-l4-spot": ("gcp", "us-central1", "kubernetes", Purchasing.spot, "l4", 8, 16, 0.30, 0.03),
    "azure-a100-spot": ("azure", "eastus", "kubernetes", Purchasing.spot, "a100-80gb", 8, 8, 1.50, 0.03),
    "anyscale-l40s-spot": ("anyscale", "us-west-2", "ray", Purchasing.spot, "l40s", 8, 8, 0.90, 0.02),
}
TEAMS = {"cell": ("cell", 2.0), "lab-a": ("lab-a", 1.0), "lab-b": ("lab-b", 1.0), "robotics": ("robotics", 2.0)}  # member, weight
NOMINAL = {  # pool: {team: GPUs}; what a pool's teams leave unassigned is borrowable in the cohort
    "aws-p5-block": {"cell": 256, "robotics": 128, "lab-a": 64, "lab-b": 64},
    "gcp-a3-reserved": {"robotics": 128, "lab-a": 64, "lab-b": 64},
    "azure-nd-reserved": {"cell": 128, "lab-a": 64, "lab-b": 64},
    "coreweave-reserved": {"robotics": 128, "cell": 64, "lab-a": 32, "lab-b": 32},
    "onprem-a100": {"cell": 64, "robotics": 64, "lab-a": 64, "lab-b": 64},
    "lambda-h100-ondemand": {"cell": 64, "lab-a": 32, "lab-b": 32},
    "aws-p5-ondemand": {"cell": 32, "robotics": 32, "lab-a": 32, "lab-b": 32},
    "gcp-a3-ondemand": {},
    "aws-g6e-spot": {"robotics": 96, "cell": 32},
    "gcp-l4-spot": {"robotics": 128},
    "azure-a100-spot": {"lab-a": 32, "lab-b": 32},
    "anyscale-l40s-spot": {"robotics": 64},
}
LOADS = {"light": 0.7, "busy": 0.85, "heavy": 1.0}  # each job's drawn hours times this
CLASSES = {"deadline": 1000, "training": 500, "sweep": 100}
H100S, TRAINING_GPUS = ["h100-80gb"], ["h100-80gb", "a100-80gb"]


def fleet() -> dict[str, Pool]:
    pools = {}
    settings = {"slurm": {"partition": "gpu"}, "ray": {"address": "http://127.0.0.1:8265"}, "kubernetes": {}}
    for name, (provider, region, backend, purchasing, accelerator, gpn, nodes, price, rate) in FLEET.items():
        pools[name] = Pool(
            name=name, provider=provider, region=region, backend=backend, backend_settings=settings[backend], purchasing=purchasing, capacity="every",
            accelerator=accelerator, gpus_per_node=gpn, nodes=nodes, price_per_gpu_hour=price, interruption_rate_per_hour=rate,
            interconnect_domain_gpus=gpn * nodes if purchasing in RESERVED else None, qualify=False,
            committed_gpu_hours=gpn * nodes * WEEK if purchasing in RESERVED else None, marginal_price_per_gpu_hour=0.1 if purchasing in RESERVED else 0.0,
        )  # fmt: skip
    return pools


def quotas() -> Quotas:
    return Quotas.model_validate({
        "teams": {name: {"members": [member], "weight": weight} for name, (member, weight) in TEAMS.items()},
        "cohorts": {"fleet": {"teams": list(TEAMS)}},
        "quotas": {pool: {team: {"gpus": gpus} for team, gpus in shares.items()} for pool, shares in NOMINAL.items()},
        "priority_classes": CLASSES, "default_priority": "training", "file": "benchmarks/queue_fleet.py",
    })  # fmt: skip


# The lanes' step shapes: (team, kind, class, StepSpec fields). Placement ranks each shape once.
SHAPES: dict[str, tuple[str, str, str, dict[str, Any]]] = {
    "pretraining": ("cell", "pretraining", "training", dict(tenant="cell", gpus=256, nodes=32, accelerators=H100S, tightly_coupled=True, capacity="steady", checkpoint_seconds=180)),
    "cell-fine-tune": ("cell", "fine-tune", "training", dict(tenant="cell", gpus=8, accelerators=TRAINING_GPUS, capacity="burst", checkpoint_seconds=60)),
    "lab-a-fine-tune": ("lab-a", "fine-tune", "training", dict(tenant="lab-a", gpus=8, accelerators=TRAINING_GPUS, capacity="burst", checkpoint_seconds=60)),
    "lab-b-fine-tune": ("lab-b", "fine-tune", "training", dict(tenant="lab-b", gpus=8, accelerators=TRAINING_GPUS, capacity="burst", checkpoint_seconds=60)),
    "policy": ("robotics", "policy", "training", dict(tenant="robotics", gpus=64, nodes=8, accelerators=TRAINING_GPUS, tightly_coupled=True, capacity="steady", checkpoint_seconds=120)),
    "sweep": ("robotics", "sweep", "sweep", dict(tenant="robotics", gpus=4, capacity="burst", checkpoint_seconds=20)),
    "evaluation": ("robotics", "evaluation", "deadline", dict(tenant="robotics", gpus=8, accelerators=TRAINING_GPUS, capacity="evaluation", checkpoint_seconds=30)),
}


def plans(pools: dict[str, Pool]) -> dict[str, tuple[tuple[str, ...], dict[str, int]]]:
    """Each shape's ranked pools (the product's planner) and the GPUs it holds on each."""
    ranked = {}
    for shape, (_, _, _, fields) in SHAPES.items():
        spec = StepSpec(name=f"fleet.{shape}", entry_point="workload_runtime.noop", start=T0, **fields)
        plan = plan_placement(spec, pools)
        ranked[shape] = (tuple(p.name for p in plan.ranked), {p.name: held_gpus(spec, p) for p in plan.ranked})
    return ranked


def workload(rng: np.random.Generator, ranked: dict, scale: float = 1.0) -> list[Job]:
    """A week of the lanes' jobs (~10,000), each `scale` times as long as drawn."""
    jobs: list[Job] = []

    def add(shape: str, at: float, hours: float) -> None:
        hours *= scale
        team, kind, cls, fields = SHAPES[shape]
        pools, held = ranked[shape]
        every = {"pretraining": 0.5, "policy": 0.5}.get(kind, 0.25)
        jobs.append(Job(f"{shape}-{len(jobs)}", team, kind, cls, CLASSES[cls], at, hours, pools, held,
                        checkpoint_hours=every, checkpoint_write_hours=fields["checkpoint_seconds"] / 3600))  # fmt: skip

    for at in (2.0, 50.0, 98.0):  # pretraining runs, two days apart
        add("pretraining", at, float(rng.uniform(40, 60)))
    for _ in range(16):  # policy training gangs, any time
        add("policy", float(rng.uniform(0, WEEK - 12)), float(rng.uniform(8, 20)))
    for shape, bursts in (("lab-a-fine-tune", 40), ("lab-b-fine-tune", 30), ("cell-fine-tune", 16)):
        for _ in range(bursts):  # a lab's plates arrive in bursts during lab hours, weekdays
            day, hour = int(rng.integers(0, 5)), float(rng.uniform(8, 18))
            for _ in range(int(rng.integers(30, 70))):
                add(shape, day * 24 + hour + float(rng.exponential(0.3)), float(rng.uniform(2, 9)))
    for night in range(7):  # the nightly simulation sweep at 22:00
        for _ in range(800):
            add("sweep", night * 24 + 22 + float(rng.exponential(0.5)), float(rng.uniform(1, 4)))
    for day in range(7):  # real-robot evaluations booked through the day
        for _ in range(10):
            add("evaluation", day * 24 + float(rng.uniform(7, 20)), float(rng.uniform(0.5, 1.5)))
    return [job for job in jobs if job.arrival < WEEK and job.ranked]


def interruptions(rng: np.random.Generator, pools: dict[str, Pool]) -> list[Interruption]:
    """The spot trace: per spot pool, node reclaims as a Poisson process at its interruption rate."""
    trace = []
    for pool in pools.values():
        if pool.purchasing is not Purchasing.spot or not pool.interruption_rate_per_hour:
            continue
        at = 0.0
        while (at := at + float(rng.exponential(1 / (pool.interruption_rate_per_hour * pool.nodes)))) < WEEK:
            trace.append(Interruption(at, pool.name, pool.gpus_per_node, float(rng.uniform(0.5, 4)), NOTICE_HOURS[pool.provider]))
    return trace


@dataclass
class PolicyResult:
    load: str
    demand_over_reserved: float  # GPU-hours asked for that week over the reserved pools' GPU-hours
    policy: str
    reserved_utilisation: float
    fleet_utilisation: float
    teams: dict[str, dict[str, float]]  # team -> demand, held, fair, ratio
    contended_hours: int
    jain: float
    max_fair_share_gap: float
    waits_h: dict[str, dict[str, float]]  # class -> p50, p99, waiting at the end
    goodput: float
    lost_gpu_hours: dict[str, float]
    cost_usd: float
    usd_per_productive_gpu_hour: float
    jobs_finished: int
    preemptions: int
    wall_s: float


def fair_split(total: float, demand: dict[str, float], weight: dict[str, float]) -> dict[str, float]:
    """Weighted max-min: `total` split by weight, no team given more than it asked for."""
    fair, left, open_ = {t: 0.0 for t in demand}, total, set(demand)
    while open_ and left > 1e-9:
        unit = left / sum(weight[t] for t in open_)
        capped = {t for t in open_ if demand[t] - fair[t] <= unit * weight[t]}
        if not capped:
            for t in open_:
                fair[t] += unit * weight[t]
            break
        for t in capped:
            left -= demand[t] - fair[t]
            fair[t] = demand[t]
        open_ -= capped
    return fair


def measure(sim: Simulation, pools: dict[str, Pool], weights: dict[str, float], wall_s: float, load: str = "") -> PolicyResult:
    held, kept = sim.ledger.held, sim.ledger.productive
    reserved = [p for p in pools.values() if p.purchasing in RESERVED]
    reserved_held = sum(v for (_, pool), v in held.items() if pools[pool].purchasing in RESERVED)
    reserved_have = sum(p.gpus_per_node * p.nodes for p in reserved) * WEEK
    all_have = sum(p.gpus_per_node * p.nodes for p in pools.values()) * WEEK
    by_team = {t: sum(v for (team, _), v in held.items() if team == t) for t in weights}
    demand = {t: 0.0 for t in weights}
    for job in sim.jobs.values():  # what each team asked for that could have run this week
        demand[job.team] += job.held[job.ranked[0]] * min(job.hours, WEEK - job.arrival)
    fair = fair_split(sum(by_team.values()), demand, weights)
    # Under contention (an hour when some team's work waits): each team's GPUs against the
    # weighted max-min split of the GPUs held that hour, capped at what it had running and waiting.
    got, owed, contended = {t: 0.0 for t in weights}, {t: 0.0 for t in weights}, 0
    for sample in sim.samples:
        if not any(wait for _, wait in sample.values()):
            continue
        contended += 1
        asked = {t: float(sum(sample.get(t, (0, 0)))) for t in weights}
        split = fair_split(float(sum(h for h, _ in sample.values())), asked, weights)
        for t in weights:
            got[t] += sample.get(t, (0, 0))[0]
            owed[t] += split[t]
    ratios = {t: got[t] / owed[t] if owed[t] else 1.0 for t in weights}
    jain = sum(ratios.values()) ** 2 / (len(ratios) * sum(r * r for r in ratios.values()))
    waits: dict[str, list[float]] = {}
    waiting = {c: 0 for c in CLASSES}
    for job in sim.jobs.values():
        if job.first_start is None:
            waiting[job.priority_class] += 1
        waits.setdefault(job.priority_class, []).append((job.first_start if job.first_start is not None else WEEK) - job.arrival)
    cost = sum(p.gpus_per_node * p.nodes * WEEK * p.price_per_gpu_hour for p in reserved)
    cost += sum(v * pools[pool].price_per_gpu_hour for (_, pool), v in held.items() if pools[pool].purchasing not in RESERVED)
    productive = sum(kept.values())
    return PolicyResult(
        load=load, demand_over_reserved=sum(demand.values()) / reserved_have, policy=sim.policy, reserved_utilisation=reserved_held / reserved_have, fleet_utilisation=sum(held.values()) / all_have,
        teams={t: {"demand_gpu_h": demand[t], "held_gpu_h": by_team[t], "fair_gpu_h": fair[t], "week_ratio": by_team[t] / fair[t] if fair[t] else 1.0,
                   "contended_gpu_h": got[t], "contended_fair_gpu_h": owed[t], "ratio": ratios[t]} for t in weights}, contended_hours=contended,
        jain=jain, max_fair_share_gap=max(abs(r - 1) for r in ratios.values()),
        waits_h={c: {"p50": float(np.percentile(w, 50)), "p99": float(np.percentile(w, 99)), "waiting_at_end": waiting[c]} for c, w in waits.items()},
        goodput=productive / sum(held.values()), lost_gpu_hours=dict(sim.ledger.lost), cost_usd=cost,
        usd_per_productive_gpu_hour=cost / productive, jobs_finished=sum(j.finished is not None for j in sim.jobs.values()),
        preemptions=sum(j.preemptions for j in sim.jobs.values()), wall_s=wall_s,
    )  # fmt: skip


@dataclass
class DecisionTime:
    running_jobs: int
    queues_now_us: float  # the pools' queues from the in-flight records, once per step
    decide_us: float  # one step's admission over its ranked pools


def decision_time(pools: dict[str, Pool], q: Quotas, ranked: dict, repeats: int) -> DecisionTime:
    """Admission's cost per step with a fleet's worth of jobs in flight (600, ~1,900 GPUs held)."""
    from control_plane.queues.admission import Request
    from control_plane.queues.usage import queues_now

    rng = np.random.default_rng(SEED)
    members = [m for m, _ in TEAMS.values()]
    records = []
    for k in range(600):
        pool = list(pools)[k % len(pools)]
        records.append({"handle": {"backend": "slurm", "pool": pool, "job_id": str(k), "submitted_at": float(k)},
                        "owner": {"tenant": members[k % len(members)], "gpus": int(rng.choice([1, 2, 4])), "priority_class": "training"}})  # fmt: skip
    order, held = ranked["lab-a-fine-tune"]
    build, decide = [], []
    for _ in range(max(repeats, 5)):
        started = time.perf_counter()
        queues = queues_now(records, pools, q)
        build.append(time.perf_counter() - started)
        started = time.perf_counter()
        for pool in order:
            queues[pool].decide(Request("new", "lab-a", held[pool], CLASSES["training"], 1e9))
        decide.append(time.perf_counter() - started)
    return DecisionTime(len(records), statistics.median(build) * 1e6, statistics.median(decide) * 1e6)


def run(repeats: int = 1) -> dict[str, Any]:
    pools, q = fleet(), quotas()
    ranked = plans(pools)
    weights = {t: w for t, (_, w) in TEAMS.items()}
    committed = {n for n, p in pools.items() if p.purchasing in RESERVED and n in q.quotas}
    results = []
    for load, scale in LOADS.items():  # the same jobs and trace, each job's hours scaled
        rng = np.random.default_rng(SEED)
        jobs, trace = workload(rng, ranked, scale), interruptions(rng, pools)
        for policy in POLICIES:
            started = time.perf_counter()
            moves = MOVE_MIN_HOURS if policy == "queues" else None  # the product's default: moves on
            sim = Simulation(policy, {n: p.gpus_per_node * p.nodes for n, p in pools.items()}, q, [_fresh(j) for j in jobs], trace, WEEK, committed, moves).run()
            results.append(measure(sim, pools, weights, time.perf_counter() - started, load))
    return {
        "fleet": {"pools": len(pools), "gpus": sum(p.gpus_per_node * p.nodes for p in pools.values()),
                  "reserved_gpus": sum(p.gpus_per_node * p.nodes for p in pools.values() if p.purchasing in RESERVED),
                  "teams": len(TEAMS), "jobs": len(jobs), "interruptions": len(trace),
                  "plans": {shape: list(order) for shape, (order, _) in ranked.items()}},  # fmt: skip
        "policies": [asdict(r) for r in results],
        "decision": asdict(decision_time(pools, q, ranked, repeats)),
    }


def _fresh(job: Job) -> Job:
    return Job(job.id, job.team, job.kind, job.priority_class, job.priority, job.arrival, job.hours, job.ranked, job.held,
               job.checkpoint_hours, job.checkpoint_write_hours)  # fmt: skip


def tables(result: dict[str, Any]) -> list[Table]:
    f = result["fleet"]
    main = Table(title=f"Figure 15: a simulated week, {f['gpus']:,} GPUs in {f['pools']} pools ({f['reserved_gpus']:,} reserved), "
                 f"{f['teams']} teams, {f['jobs']:,} jobs, {f['interruptions']} spot interruptions", title_justify="left",
                 caption="Jain and worst team: each team's GPU-hours against its fair share in the hours when work waited (next table); waits include jobs still "
                 "waiting at the week's end (lower bounds); cost: reserved and block paid in full, on-demand and spot by the hour", caption_justify="left")  # fmt: skip
    for column in ("Week", "Policy", "Reserved util.", "Fleet util.", "Jain", "Worst team vs fair", *(f"{c} wait p50/p99 h" for c in CLASSES),
                   "Goodput", "Cost $", "$/productive GPU-h", "Finished", "Preemptions", "Sim s"):  # fmt: skip
        main.add_column(column, justify="left" if column in ("Week", "Policy") else "right")
    for r in result["policies"]:
        waits = [f"{r['waits_h'][c]['p50']:.1f} / {r['waits_h'][c]['p99']:.1f}" if c in r["waits_h"] else "—" for c in CLASSES]
        week = f"{r['load']} ({r['demand_over_reserved']:.2f}× reserved)" if r["policy"] == POLICIES[0] else ""
        main.add_row(week, r["policy"], f"{r['reserved_utilisation']:.1%}", f"{r['fleet_utilisation']:.1%}", f"{r['jain']:.3f}",
                     f"{r['max_fair_share_gap']:.1%}", *waits, f"{r['goodput']:.1%}", f"{r['cost_usd']:,.0f}",
                     f"{r['usd_per_productive_gpu_hour']:.2f}", f"{r['jobs_finished']:,}", f"{r['preemptions']:,}", f"{r['wall_s']:.1f}")  # fmt: skip
    shares = Table(title="Figure 15: each team's GPU-hours against its fair share, in the hours when work waited", title_justify="left",
                   caption="fair: each such hour, the GPUs held split by weighted max-min (weights " + ", ".join(f"{t} {w:g}" for t, (_, w) in TEAMS.items())
                   + "), no team given more than it had running and waiting; summed over the week", caption_justify="left")  # fmt: skip
    for column in ("Week", "Policy", "Contended h", *(f"{t} held / fair GPU-h" for t in TEAMS)):
        shares.add_column(column, justify="left" if column in ("Week", "Policy") else "right")
    for r in result["policies"]:
        shares.add_row(r["load"] if r["policy"] == POLICIES[0] else "", r["policy"], str(r["contended_hours"]),
                       *(f"{r['teams'][t]['contended_gpu_h']:,.0f} / {r['teams'][t]['contended_fair_gpu_h']:,.0f} ({r['teams'][t]['ratio']:.2f})" for t in TEAMS))  # fmt: skip
    d = result["decision"]
    decision = Table(title="Figure 15: admission per step at fleet scale", title_justify="left",
                     caption=f"{d['running_jobs']} jobs in flight; median of repeats", caption_justify="left")  # fmt: skip
    for column in ("Part", "µs"):
        decision.add_column(column, justify="left" if column == "Part" else "right")
    decision.add_row("each pool's queue from the in-flight records (queues_now)", f"{d['queues_now_us']:,.0f}")
    decision.add_row("a step's decision over its ranked pools (PoolQueue.decide)", f"{d['decide_us']:,.0f}")
    return [main, shares, decision]


def main() -> None:
    print_tables(tables(run()))


if __name__ == "__main__":
    main()
