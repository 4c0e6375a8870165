"""Data agreements: each dataset version carries its tenant and agreement; training on more than one
tenant's data needs every agreement to allow shared models (a blocking check); placement keeps a
step inside its tenants' and its data's agreed regions; a model's lineage names what it rests on."""

import json
from pathlib import Path

import dagster as dg
import pytest

from control_plane.catalog.pools import Catalog, Pool, load_pools
from control_plane.catalog.step_spec import StepSpec
from control_plane.catalog.tenants import Agreement
from control_plane.placement.ranking import plan_placement
from control_plane.tenancy.agreements import AgreedData, check_shared_training, describe, limits_for
from data_layer.agreement_checks import SHARED_TRAINING_CHECK, require_shared_training, shared_training_check_spec
from data_layer.lineage import LineageStore
from data_layer.provenance import agreements_of, find_version, publish_version, record_result
from workload_runtime.storage import Storage

PRIVATE = Agreement(shared_models=False)
SHARED = Agreement(shared_models=True, outside_models=["anthropic"], regions=["eu-west-1", "eu-central-1"])


# The words ---------------------------------------------------------------------------------
def test_an_agreement_reads_in_one_line():
    assert describe(Agreement()) == "shared models: no · outside models: none · regions: any"
    assert describe(SHARED) == "shared models: yes · outside models: anthropic · regions: eu-west-1, eu-central-1"
    assert describe(Agreement(regions=[])) == "shared models: no · outside models: none · regions: none"


def test_one_tenant_needs_no_shared_model_agreement_and_two_need_both():
    own = check_shared_training([AgreedData("cell/omics@a1", "lab-a", PRIVATE), AgreedData("cell/ref@1")])
    assert own.allowed and own.tenants == ["lab-a"]
    mixed = check_shared_training([AgreedData("cell/omics@a1", "lab-a", SHARED), AgreedData("cell/omics@b1", "lab-b", PRIVATE)])
    assert not mixed.allowed and mixed.refusing == ["lab-b"] and mixed.tenants == ["lab-a", "lab-b"]
    assert "`cell/omics@b1` of lab-b: its agreement does not allow shared models" in mixed.reason
    assert "agreement.shared_models: true" in mixed.reason and "one model per tenant" in mixed.reason
    unrecorded = check_shared_training([AgreedData("cell/omics@a1", "lab-a", SHARED), AgreedData("cell/omics@b0", "lab-b")])
    assert not unrecorded.allowed and "it records no agreement" in unrecorded.reason
    both = check_shared_training([AgreedData("cell/omics@a1", "lab-a", SHARED), AgreedData("cell/omics@b1", "lab-b", SHARED)])
    assert both.allowed and both.refusing == []


def test_limits_for_is_the_intersection_of_the_agreed_regions():
    assert limits_for([AgreedData("x@1", "lab-a", PRIVATE), AgreedData("y@1")]) is None
    eu = limits_for([AgreedData("x@1", "lab-a", SHARED), AgreedData("y@1", "lab-b", Agreement(regions=["eu-west-1", "us-east-1"]))])
    assert eu.regions == ["eu-west-1"] and eu.providers is None
    assert eu.reason.startswith("the data agreement of lab-a (x@1: eu-west-1, eu-central-1), lab-b (y@1: eu-west-1, us-east-1)")
    apart = limits_for([AgreedData("x@1", "lab-a", SHARED), AgreedData("y@1", "lab-b", Agreement(regions=["us-east-1"]))])
    assert apart.regions == []


# Placement ---------------------------------------------------------------------------------
def _step(tenant: str, **kw) -> StepSpec:
    return StepSpec(name="cell.finetune", entry_point="x", tenant=tenant, capacity="burst", **kw)


def _pool(name: str, region: str, tenants: list[str] | None) -> Pool:
    return Pool(name=name, provider="aws", region=region, backend="local", purchasing="on_demand", capacity="burst",
                accelerator="h100-80gb", gpus_per_node=8, nodes=1, price_per_gpu_hour=3.0 if region == "eu-west-1" else 2.0,
                interruption_rate_per_hour=0.0, tenants=tenants)


def test_a_lab_of_the_cell_lane_runs_on_the_pools_that_list_the_lane():
    plan = plan_placement(_step("lab-a"), load_pools())
    assert [p.name for p in plan.ranked] == ["cell-burst", "cell-burst-ondemand"]
    robotics = next(v for v in plan.verdicts if v.pool == "robot-sim-spot")
    assert "tenant `lab-a` (lane `cell`) not allowed (allowed: robotics)" in robotics.reasons


def test_a_pool_may_name_the_tenant_itself():
    catalog = Catalog({"own": _pool("own", "us-east-1", ["lab-b"]), "other": _pool("other", "us-east-1", ["robotics"])})
    assert [p.name for p in plan_placement(_step("lab-b"), catalog).ranked] == ["own"]


def test_a_tenant_s_agreed_regions_refuse_a_pool_with_evidence(tmp_path, monkeypatch):
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n  lab-a: {lane: cell}\n  lab-b:\n    lane: cell\n    agreement: {shared_models: false, regions: [eu-west-1]}\n"
    )
    monkeypatch.setenv("SINEWGRID_TENANTS", str(tenants))
    catalog = Catalog({"us": _pool("us", "us-east-1", ["cell"]), "eu": _pool("eu", "eu-west-1", ["cell"])})
    assert [p.name for p in plan_placement(_step("lab-a"), catalog).ranked] == ["us", "eu"]  # cheaper first
    plan = plan_placement(_step("lab-b"), catalog)
    assert [p.name for p in plan.ranked] == ["eu"]
    assert plan.verdict("us").refused_by == ["tenant_limits"]
    assert plan.verdict("us").reasons == [
        "the data agreement of tenant `lab-b` keeps its data in eu-west-1, not aws us-east-1 (tenants catalog `agreement.regions`)"
    ]


def test_the_step_s_data_agreements_refuse_a_pool_with_evidence():
    catalog = Catalog({"us": _pool("us", "us-east-1", ["cell"]), "eu": _pool("eu", "eu-west-1", ["cell"])})
    limits = limits_for([AgreedData("cell/omics@a1", "lab-a", SHARED)])
    plan = plan_placement(_step("lab-a", limits=limits), catalog)
    assert [p.name for p in plan.ranked] == ["eu"]
    assert plan.verdict("us").reasons == [
        "the data agreement of lab-a (cell/omics@a1: eu-west-1, eu-central-1) does not allow aws us-east-1 "
        "(allowed providers: any; regions: eu-west-1, eu-central-1)"
    ]


# A dataset version carries its agreement; the blocking check on a shared model ------------
def _data(folder: Path, rows: int) -> str:
    folder.mkdir(parents=True)
    (folder / "plates.json").write_text(json.dumps({"rows": rows}))
    return str(folder)


def _trainer(store: Storage, refs: list[str]):
    @dg.asset(name="shared_model", check_specs=[shared_training_check_spec("shared_model")])
    def shared_model(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        """A model that learns from both labs' plates."""
        agreed = require_shared_training(context, check_shared_training(agreements_of(store, refs)))
        metadata = record_result(store, "cell/shared_model/run-1", "model", "a model of both labs", inputs=refs)
        return dg.MaterializeResult(metadata=metadata, check_results=[agreed])

    @dg.asset(deps=[shared_model])
    def next_plate() -> None:
        """What the model proposes next."""

    return [shared_model, next_plate]


def _materialized(result: dg.ExecuteInProcessResult) -> set[str]:
    return {event.asset_key.to_user_string() for event in result.get_asset_materialization_events()}


def test_a_model_of_two_tenants_trains_only_when_both_agree(tmp_path):
    store = Storage.at(str(tmp_path / "root"))
    a1, _ = publish_version(store, "cell/plates-a", "v1", _data(tmp_path / "a1", 1), title="lab A plates", inputs=[],
                            tenant="lab-a", agreement=SHARED)
    b1, meta = publish_version(store, "cell/plates-b", "v1", _data(tmp_path / "b1", 2), title="lab B plates", inputs=[], tenant="lab-b")
    # lab-b's agreement comes from the packaged tenants catalog (no shared models) and survives the registry.
    found = find_version(store, b1.ref)
    assert found.meta["tenant"] == "lab-b" and found.meta["agreement"]["shared_models"] is False
    assert meta["agreement"] == "shared models: no · outside models: none · regions: any"
    assert LineageStore(store.root).get(a1.ref).facts["agreement"] == describe(SHARED)

    instance = dg.DagsterInstance.ephemeral()
    refused = dg.materialize(_trainer(store, [a1.ref, b1.ref]), instance=instance, raise_on_error=False)
    assert not refused.success
    assert _materialized(refused) == set()  # nothing trained, and the downstream asset did not run
    key = dg.AssetCheckKey(dg.AssetKey("shared_model"), SHARED_TRAINING_CHECK)
    [record] = instance.event_log_storage.get_asset_check_execution_history(key, limit=1)
    evaluation = record.evaluation
    assert not evaluation.passed and evaluation.blocking
    assert evaluation.metadata["refusing"].value == "lab-b"
    assert "`cell/plates-b@v1` of lab-b" in evaluation.metadata["reason"].value
    assert "cell/shared_model/run-1" not in LineageStore(store.root).ids()

    b2, _ = publish_version(store, "cell/plates-b", "v2", _data(tmp_path / "b2", 3), title="lab B plates", inputs=[],
                            tenant="lab-b", agreement=Agreement(shared_models=True))
    trained = dg.materialize(_trainer(store, [a1.ref, b2.ref]), instance=instance)
    assert _materialized(trained) == {"shared_model", "next_plate"}
    assert [c.passed for c in trained.get_asset_check_evaluations()] == [True]
    model = LineageStore(store.root).get("cell/shared_model/run-1")
    assert model.facts["rests_on"] == (
        "lab-a (shared models: yes · outside models: anthropic · regions: eu-west-1, eu-central-1); "
        "lab-b (shared models: yes · outside models: none · regions: any)"
    )


def test_a_model_s_lineage_carries_what_its_input_model_rests_on(tmp_path):
    store = Storage.at(str(tmp_path / "root"))
    lineage = LineageStore(store.root)
    lineage.record("cell/plates-a@v1", "dataset", "lab A plates", facts={"tenant": "lab-a", "agreement": describe(PRIVATE)})
    record_result(store, "cell/foundation/run-1", "model", "pretrained", inputs=["cell/plates-a@v1"])
    record_result(store, "cell/finetune/run-1", "model", "fine-tuned", inputs=["cell/foundation/run-1", "cell/public@v1"])
    assert lineage.get("cell/finetune/run-1").facts["rests_on"] == "lab-a (shared models: no · outside models: none · regions: any)"
    record_result(store, "cell/eval/run-1", "evaluation", "evaluated", inputs=["cell/finetune/run-1"])
    assert "rests_on" not in lineage.get("cell/eval/run-1").facts


@pytest.mark.parametrize(("tenant", "outside"), [("lab-a", ["standin-anthropic"]), ("lab-b", [])])
def test_the_packaged_labs_agree_to_no_shared_models(tenant, outside):
    from control_plane.catalog.tenants import load_tenants

    # Neither lab's plates train a shared model; lab-a lets one outside provider write its notes.
    assert load_tenants().get_tenant(tenant).agreement == Agreement(shared_models=False, outside_models=outside)
