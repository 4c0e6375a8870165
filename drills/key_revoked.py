"""The key-revoked drill (`sinewgrid drill -s key-revoked`): a tenant disables its key, and then?

Two drill tenants, each with its own root under the storage root and its own local key file,
pretrain on their own (sealed) omics matrix through the real compute resource. Then tenant A's
key is disabled, as a customer would in its KMS, and both tenants run again; then A's key is
re-enabled and A runs once more. The drill measures what the issue promises:

- A's next run is refused at its first attempt (it cannot open its own sealed checkpoint), with
  an error that names the tenant and the key; how long from the revocation to that refusal;
- B runs on, untouched;
- re-enabled, A resumes from the checkpoint it had (nothing was lost).

On a cloud root the same happens with the tenant's KMS key (tests/test_tenancy_s3.py drills it
against a KMS API server); locally the key is a file, so disabling it is `sinewgrid tenants key
disable`.
"""


import datetime as dt
import json
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import dagster as dg
import yaml

from drills.workloads import make_omics, workload
from control_plane.accounting.ledger import read_ledger
from control_plane.catalog.tenants import load_tenants
from shared_resources.compute import ComputeResource
from workload_runtime.storage import Storage
from control_plane.settings import environment
from control_plane.tenancy.control import tenant_storage
from workload_runtime.keys import set_local_key_enabled

TENANTS = ("drill-a", "drill-b")
STEPS = 200
POOLS = {"pools": {"drill-local": {
    "provider": "local", "region": "local", "backend": "local", "purchasing": "on_demand", "capacity": "steady",
    "accelerator": "local", "gpus_per_node": 1, "price_per_gpu_hour": 1.0, "max_concurrent_steps": 2,
}}}


@dataclass
class Phase:
    phase: str
    tenant: str
    succeeded: bool
    attempts: int
    seconds: float
    said: str  # the refusal (or "resumed from step N")


@contextmanager
def _drill_tenants(work: Path, run_id: str):
    """A tenants catalog and a keys folder of the drill's own, for the duration of the drill."""
    catalog = {"tenants": {t: {"title": f"drill tenant {t}", "lane": "drills", "storage": f"drills/key-revoked/{run_id}/{t}"} for t in TENANTS}}
    (work / "tenants.yaml").write_text(yaml.safe_dump(catalog))
    (work / "pools.yaml").write_text(yaml.safe_dump(POOLS))
    with environment({"SINEWGRID_TENANTS": str(work / "tenants.yaml"), "SINEWGRID_KEYS_DIR": str(work / "keys")}):
        yield work / "pools.yaml"


def _run(instance: dg.DagsterInstance, storage_root: str, pools: Path, tenant: str, omics: str) -> tuple[bool, int, str]:
    w = workload("pretrain", "small")
    spec = w.spec("key-revoked", {"omics": omics}, "", tenant=tenant, name=f"drills.key-revoked.{tenant}")
    # What is drilled is the key, not training: a short run, checkpointed twice.
    spec = spec.model_copy(update={"config": {**spec.config, "steps": STEPS}, "checkpoint_every_steps": STEPS // 2})

    @dg.asset(name=f"key_revoked_{tenant.replace('-', '_')}", key_prefix=["platform", "drills"])
    def drill_step(context: dg.AssetExecutionContext, compute: ComputeResource) -> dg.MaterializeResult:
        step = compute.run(context, spec, lineage=f"drills/key-revoked/{tenant}")
        return dg.MaterializeResult(metadata={"attempts": len(step.attempts)})

    result = dg.materialize([drill_step], instance=instance, resources={"compute": ComputeResource(storage_root=storage_root, pools_file=str(pools))}, raise_on_error=False)
    if result.success:
        md = result.get_asset_materialization_events()[0].materialization.metadata
        return True, int(md["attempts"].value), f"finished (a resumed run reuses its checkpoints; attempts {md['attempts'].value})"
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    error = failure.event_specific_data.error
    said = " ".join(str(error.to_string() if error else "").split())
    refusal = said[said.find("tenant `"):] if "tenant `" in said else said[-400:]
    refusal = refusal.split(" Fix the workload")[0].split(" Stack Trace")[0]
    ledger = read_ledger(Storage.at(storage_root).ledger())
    attempts = int((ledger["run_id"] == result.run_id).sum()) if len(ledger) else 0
    where = "the workload, opening its checkpoint" if attempts else "the control plane, before any attempt was launched"
    return False, attempts, f"refused by {where}: {refusal[:400]}"


def run_key_revoked(instance: dg.DagsterInstance, storage_root: str, out_dir: Path, say: Callable[[str], None]) -> dict:
    """Run the drill and write `key-revoked.json` and `.md` to `out_dir`; returns the report."""
    run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    phases: list[Phase] = []
    with tempfile.TemporaryDirectory(prefix="sinewgrid-key-drill-") as folder, _drill_tenants(Path(folder), run_id) as pools:
        omics = {}
        for tenant in TENANTS:
            store: Storage = tenant_storage(storage_root, tenant)
            omics[tenant] = make_omics(store.uri("inputs", "omics.zarr"))

        def phase(name: str, tenant: str) -> Phase:
            started = time.monotonic()
            ok, attempts, said = _run(instance, storage_root, pools, tenant, omics[tenant])
            phases.append(Phase(name, tenant, ok, attempts, round(time.monotonic() - started, 2), said))
            say(f"  {name:<22} {tenant}: {'ran' if ok else 'refused'} after {attempts} attempt(s), {phases[-1].seconds:.1f}s. {said}")
            return phases[-1]

        say("key-revoked: two tenants pretrain on their own sealed data; then drill-a's key is disabled")
        for tenant in TENANTS:
            phase("before", tenant)
        key_file = load_tenants()["drill-a"].key_file()
        set_local_key_enabled(key_file, False)
        revoked_at = time.monotonic()
        refused = phase("key disabled", "drill-a")
        to_refusal = round(time.monotonic() - revoked_at, 2)
        other = phase("key disabled", "drill-b")
        set_local_key_enabled(key_file, True)
        restored = phase("key re-enabled", "drill-a")
    report = {
        "drill": "key-revoked", "at": run_id,
        "phases": [asdict(p) for p in phases],
        "refused_within_one_attempt": (not refused.succeeded) and refused.attempts <= 1,
        "refusal_names_key_and_tenant": "drill-a" in refused.said and "local:drill-a" in refused.said,
        "seconds_from_revocation_to_refusal": to_refusal,
        "other_tenant_ran_on": other.succeeded,
        "restored_after_re_enabling": restored.succeeded,
    }
    report["passed"] = all(report[k] for k in ("refused_within_one_attempt", "refusal_names_key_and_tenant", "other_tenant_ran_on", "restored_after_re_enabling"))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "key-revoked.json").write_text(json.dumps(report, indent=2))
    (out_dir / "key-revoked.md").write_text(markdown(report))
    return report


def markdown(report: dict) -> str:
    rows = "\n".join(f"| {p['phase']} | {p['tenant']} | {'ran' if p['succeeded'] else 'refused'} | {p['attempts']} | {p['seconds']:.1f} | {p['said']} |" for p in report["phases"])
    return (
        f"# Key-revoked drill ({report['at']})\n\n"
        "| phase | tenant | outcome | attempts | seconds | what it said |\n|---|---|---|---|---|---|\n" + rows + "\n\n"
        f"- refused within one attempt: **{report['refused_within_one_attempt']}**, naming the key and the tenant: **{report['refusal_names_key_and_tenant']}**\n"
        f"- from disabling the key to the refusal: **{report['seconds_from_revocation_to_refusal']:.1f} s** (one run: start, place, launch, fail to open the checkpoint)\n"
        f"- the other tenant ran on: **{report['other_tenant_ran_on']}**; re-enabled, the tenant resumed: **{report['restored_after_re_enabling']}**\n"
    )
