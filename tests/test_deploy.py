"""What `deploy/` describes agrees with the code: the production instance config validates against
the classes it names, the Helm values load the same code locations as workspace.yaml, the images
pin what pyproject.toml and mk/isaaclab.mk pin, and every pool catalog loads.

Helm does not run here: the chart is checked by parsing. The images are built by `make images`
(tests/test_images.py checks how it names and fills them).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import dagster as dg
import kubernetes
import pytest
import yaml
from dagster._config import process_config, resolve_to_config_type
from dagster._core.instance.config import dagster_instance_config
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.tags import CODE_LOCATION_TAG
from dagster_k8s.models import k8s_model_from_dict
from control_plane.compute.backends.slurm_batch import BATCH_TEMPLATE, SlurmContainer
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from control_plane.catalog.pools import load_pools

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
DOCKER = DEPLOY / "docker"
HELM_VALUES = DEPLOY / "helm" / "values.yaml"


# --- what the repository pins ---------------------------------------------------------------


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _pinned(package: str) -> str:
    """The exact version pyproject.toml pins `package` to (`==X`)."""
    for line in _pyproject()["project"]["dependencies"]:
        req = Requirement(line)
        if req.name == package:
            pins = [s.version for s in req.specifier if s.operator == "=="]
            assert pins, f"pyproject.toml: `{line}` is not pinned exactly; the images restate exact pins"
            return pins[0]
    raise AssertionError(f"pyproject.toml does not list {package}")


def _isaaclab_mk() -> dict[str, str]:
    """The `NAME ?= value` settings of mk/isaaclab.mk."""
    text = (REPO / "mk" / "isaaclab.mk").read_text()
    return {m[1]: m[2].strip() for m in re.finditer(r"^([A-Z0-9_]+)\s*\?=\s*(.*)$", text, re.M)}


def _dockerfile_args(name: str) -> dict[str, str]:
    """The `ARG NAME=default` values of deploy/docker/<name>.Dockerfile."""
    path = DOCKER / f"{name}.Dockerfile"
    args: dict[str, str] = {}
    for m in re.finditer(r"^ARG\s+([A-Za-z0-9_]+)=(.*)$", path.read_text(), re.M):
        value = m[2].strip()
        value = shlex.split(value)[0] if value.startswith(('"', "'")) else value
        assert args.get(m[1], value) == value, f"{path.name}: ARG {m[1]} has two different defaults"
        args[m[1]] = value
    return args


def _workspace_locations() -> dict[str, str]:
    """Code location name -> module, as workspace.yaml loads them."""
    doc = yaml.safe_load((REPO / "workspace.yaml").read_text())
    return {e["python_module"]["location_name"]: e["python_module"]["module_name"] for e in doc["load_from"]}


def _helm() -> dict[str, Any]:
    return yaml.safe_load(HELM_VALUES.read_text())


def _instance_yaml() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "dagster.yaml").read_text())


def _env_names(node: object) -> set[str]:
    """Every `{env: NAME}` reference in a config tree."""
    if isinstance(node, dict):
        if set(node) == {"env"}:
            return {node["env"]}
        return set().union(*(_env_names(v) for v in node.values())) if node else set()
    if isinstance(node, list):
        return set().union(*(_env_names(v) for v in node)) if node else set()
    return set()


# --- the production instance (deploy/dagster.yaml) -----------------------------------------


def test_production_instance_config_validates():
    config, _ = dagster_instance_config(str(DEPLOY))
    assert "postgres" in config["storage"]
    assert config["storage"]["postgres"]["postgres_db"]["scheme"] == "postgresql+psycopg2"
    assert config["telemetry"]["enabled"] is False
    assert "SQLite" in (DEPLOY / "dagster.yaml").read_text(), "dagster.yaml must say local runs use SQLite, not this file"


def test_each_configured_class_imports_and_accepts_its_config(monkeypatch: pytest.MonkeyPatch):
    env_names = _env_names(_instance_yaml())
    assert {"DAGSTER_PG_PASSWORD", "DAGSTER_COMPUTE_LOG_BUCKET"} <= env_names
    for name in env_names:
        monkeypatch.setenv(name, f"dummy-{name.lower()}")

    ref = InstanceRef.from_dir(str(DEPLOY))
    configured = {
        "storage": ref.storage_data,
        "run_coordinator": ref.run_coordinator_data,
        "run_launcher": ref.run_launcher_data,
        "compute_logs": ref.compute_logs_data,
    }
    classes = {}
    for role, data in configured.items():
        try:
            module = importlib.import_module(data.module_name)
        except ModuleNotFoundError as exc:
            pytest.fail(f"deploy/dagster.yaml `{role}` needs {exc.name}, not installed: add it to pyproject.toml (same pin family as dagster-k8s)")
        klass = getattr(module, data.class_name, None)
        assert klass is not None, f"deploy/dagster.yaml `{role}`: {data.module_name} has no class {data.class_name}"
        result = process_config(resolve_to_config_type(klass.config_type()), data.config_dict)
        assert result.success, f"deploy/dagster.yaml `{role}` ({data.class_name}): {[e.message for e in result.errors or []]}"
        classes[role] = f"{klass.__module__.split('.')[0]}.{klass.__name__}"
    assert classes == {
        "storage": "dagster_postgres.DagsterPostgresStorage",
        "run_coordinator": "dagster.QueuedRunCoordinator",
        "run_launcher": "dagster_k8s.K8sRunLauncher",
        "compute_logs": "dagster_aws.S3ComputeLogManager",
    }

    # The environment is really read: without one of its variables the same config is refused.
    monkeypatch.delenv("DAGSTER_COMPUTE_LOG_BUCKET")
    data = ref.compute_logs_data
    klass = getattr(importlib.import_module(data.module_name), data.class_name)
    assert not process_config(resolve_to_config_type(klass.config_type()), data.config_dict).success


def test_run_queue_limits_each_lane_the_same_in_both_instance_configs():
    instance_limits = _instance_yaml()["run_coordinator"]["config"]["tag_concurrency_limits"]
    queued = _helm()["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert queued["tagConcurrencyLimits"] == instance_limits
    assert queued["maxConcurrentRuns"] == _instance_yaml()["run_coordinator"]["config"]["max_concurrent_runs"]
    assert {limit["key"] for limit in instance_limits} == {CODE_LOCATION_TAG}
    assert {limit["value"] for limit in instance_limits} == set(_workspace_locations())
    assert all(limit["limit"] < queued["maxConcurrentRuns"] for limit in instance_limits), "a lane must not be able to take every run slot"


def test_run_pod_resources_are_valid_kubernetes_and_the_same_in_both():
    from_instance = _instance_yaml()["run_launcher"]["config"]["resources"]
    from_helm = _helm()["runLauncher"]["config"]["k8sRunLauncher"]["resources"]
    assert from_helm == from_instance
    model = k8s_model_from_dict(kubernetes.client.V1ResourceRequirements, from_helm)
    assert model.requests["memory"] and model.limits["memory"]
    assert not any("gpu" in key for key in {**model.requests, **model.limits}), "run pods orchestrate; GPU steps go to the pools"


# --- the Helm values (deploy/helm/values.yaml) ----------------------------------------------


def test_helm_values_load_each_lane_as_workspace_yaml_does():
    workspace = _workspace_locations()
    deployments = _helm()["dagster-user-deployments"]
    assert deployments["enabled"] is True
    by_name = {d["name"]: d for d in deployments["deployments"]}
    assert set(by_name) == set(workspace) == {"cell", "robotics", "platform"}
    for name, deployment in by_name.items():
        args = deployment["dagsterApiGrpcArgs"]
        module = args[args.index("-m") + 1]
        assert module == workspace[name], f"helm deployment `{name}` loads {module}, workspace.yaml loads {workspace[name]}"
        assert importlib.util.find_spec(module) is not None, f"helm deployment `{name}`: module {module} not found"
        assert isinstance(importlib.import_module(module).defs, dg.Definitions)
        assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True, "run pods must get the lane's image and env"


def test_helm_values_run_on_kubernetes_with_external_postgres_and_the_daemon():
    values = _helm()
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    pg = values["postgresql"]
    assert pg["enabled"] is False and pg["postgresqlHost"], "an external PostgreSQL, named by postgresqlHost"
    assert pg["postgresqlScheme"] == "postgresql+psycopg2"
    assert values["generatePostgresqlPasswordSecret"] is False and values["global"]["postgresqlSecretName"]
    daemon = values["dagsterDaemon"]
    assert daemon["enabled"] is True, "sensors and the nightly schedule need the daemon"
    assert daemon["runCoordinator"]["type"] == "QueuedRunCoordinator"
    assert values["computeLogManager"]["type"] == "S3ComputeLogManager"


def test_helm_env_names_an_s3_root_and_a_catalog_the_image_carries():
    project_version = _pyproject()["project"]["version"]
    dockerfile = (DOCKER / "orchestration.Dockerfile").read_text()
    workdir = re.search(r"^WORKDIR\s+(\S+)$", dockerfile, re.M)[1]
    assert re.search(r"^COPY deploy/pools ", dockerfile, re.M), "the orchestration image must carry deploy/pools"
    values = _helm()
    images = [values["dagsterWebserver"]["image"], values["dagsterDaemon"]["image"]]
    for deployment in values["dagster-user-deployments"]["deployments"]:
        images.append(deployment["image"])
        env = deployment["env"]
        assert env["SINEWGRID_HOME"].startswith("s3://"), f"{deployment['name']}: SINEWGRID_HOME must be an s3:// root"
        catalog = env["SINEWGRID_POOLS"]
        assert catalog.startswith(workdir + "/"), f"{deployment['name']}: SINEWGRID_POOLS must lie in the image ({workdir})"
        pools = load_pools(REPO / Path(catalog).relative_to(workdir))
        assert any(p.backend != "local" for p in pools.values())
    for image in images:
        assert image["repository"].endswith("/orchestration") and image["tag"] == project_version


def test_helm_chart_version_is_the_pinned_dagster():
    dagster_version = _pinned("dagster")
    assert f"dagster/dagster {dagster_version}" in HELM_VALUES.read_text()
    assert f"--version {dagster_version}" in (DEPLOY / "helm" / "README.md").read_text()


# --- the images (deploy/docker) -------------------------------------------------------------


def test_images_pin_what_pyproject_and_isaaclab_mk_pin():
    requires_python = SpecifierSet(_pyproject()["project"]["requires-python"])
    orchestration, workload, isaaclab = (_dockerfile_args(n) for n in ("orchestration", "workload", "isaaclab"))

    assert orchestration["TORCH_VERSION"] == workload["TORCH_VERSION"] == _pinned("torch")
    assert orchestration["DAGSTER_INTEGRATIONS_VERSION"] == _pinned("dagster-k8s") == _pinned("dagster-postgres") == _pinned("dagster-docker")
    assert orchestration["PYTHON_VERSION"] in requires_python and workload["PYTHON_VERSION"] in requires_python

    # The CUDA base image and the torch wheel index name the same CUDA (12.8.x <-> cu128).
    major, minor = workload["CUDA_VERSION"].split(".")[:2]
    assert workload["TORCH_CUDA"] == f"cu{major}{minor}", "TORCH_CUDA must match CUDA_VERSION"

    mk = _isaaclab_mk()
    assert isaaclab["ISAACLAB_VERSION"] == mk["ISAACLAB_VERSION"]
    assert isaaclab["PYTHON_VERSION"] == "3.12", "Isaac Lab 3 supports only Python 3.12"
    packages = isaaclab["ISAACLAB_WORKLOAD_PACKAGES"].split()
    assert sorted(packages) == sorted(mk["ISAACLAB_WORKLOAD_PACKAGES"].split())
    pipes = next(Requirement(p) for p in packages if Requirement(p).name == "dagster-pipes")
    assert str(pipes.specifier) == f"=={_pinned('dagster-pipes')}"


@pytest.mark.parametrize("name", ["orchestration", "workload"])
def test_project_images_copy_every_package_the_project_ships(name: str):
    """A new top-level package that the image does not copy would fail only at run time, in the cluster."""
    dockerfile = (DOCKER / f"{name}.Dockerfile").read_text()
    copied = set()
    for line in re.findall(r"^COPY\s+(.+)$", dockerfile, re.M):
        words = [w for w in line.split() if not w.startswith("--")]
        if "--from=" not in line:
            copied.update(words[:-1])  # every source; the last word is the destination
    shipped = {pattern.rstrip("*") for pattern in _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert shipped <= copied, f"{name}.Dockerfile does not COPY {sorted(shipped - copied)}"
    assert {"pyproject.toml", "README.md"} <= copied  # what `pip install .` reads
    # What the code reads from the checkout at run time: a run in either image may submit to a
    # Slurm pool, whose backend renders deploy/slurm/step.sbatch (the rehearsal found it missing).
    assert "deploy/slurm" in copied and BATCH_TEMPLATE.is_relative_to(REPO / "deploy" / "slurm"), f"{name}.Dockerfile does not COPY deploy/slurm"


# --- the pool catalogs (deploy/pools) -------------------------------------------------------


def test_cloud_pool_examples_validate_and_place():
    from control_plane.placement.ranking import plan_placement
    from control_plane.catalog.pools import Capacity
    from control_plane.catalog.step_spec import StepSpec

    files = sorted((DEPLOY / "pools").glob("*.yaml"))
    assert {f.stem for f in files} == {"aws", "gcp", "azure", "oci", "gpu-cloud"}
    everything = {}
    for path in files:
        text = path.read_text()
        assert "ILLUSTRATIVE" in text and "NOT QUOTES" in text, f"{path.name} must mark its prices as illustrative"
        everything.update(load_pools(path))
    sweep = StepSpec(name="s", entry_point="x", tenant="robotics", capacity=Capacity.burst, runtime="isaaclab", checkpoint_seconds=10)
    ranked = [p.name for p in plan_placement(sweep, everything).ranked]
    assert ranked[:2] == ["gcp-gke-g2-spot", "aws-eks-g6e-spot"]  # cheapest spot with an Isaac Lab image first
    training = StepSpec(name="t", entry_point="x", tenant="robotics", gpus=16, nodes=2, tightly_coupled=True)
    plan = plan_placement(training, everything)
    assert all(p.backend == "slurm" for p in plan.ranked)  # only pools with one fabric for 16 GPUs
    refused = {v.pool for v in plan.verdicts if not v.feasible}
    assert "aws-eks-g6e-spot" in refused and "gpucloud-ray-l40s-spot" in refused


def test_pool_runtimes_name_the_images_and_interpreters_deploy_builds():
    """Kubernetes pools run the images deploy/docker builds, tagged with the versions they carry;
    Slurm pools run an interpreter on the cluster's shared filesystem, or the workload image
    unpacked there as an OCI bundle named for its version."""
    project_version = _pyproject()["project"]["version"]
    isaaclab_version = _isaaclab_mk()["ISAACLAB_VERSION"]
    for path in sorted((DEPLOY / "pools").glob("*.yaml")):
        for pool in load_pools(path).values():
            where = f"{path.name}: pool {pool.name}"
            if pool.backend == "kubernetes":
                assert pool.runtimes["default"].endswith(f"/workload:{project_version}"), f"{where}: runtime `default`"
                if "isaaclab" in pool.runtimes:
                    assert re.search(rf"/isaaclab:{re.escape(isaaclab_version)}\b", pool.runtimes["isaaclab"]), f"{where}: runtime `isaaclab`"
            elif pool.backend == "slurm":
                for runtime, interpreter in pool.runtimes.items():
                    if isinstance(interpreter, dict):  # a container: the image's bundle (control_plane/compute/backends/slurm_batch.py)
                        assert SlurmContainer(**interpreter).container.endswith(f"/workload-{project_version}"), f"{where}: runtime `{runtime}`"
                        continue
                    assert isinstance(interpreter, str) and interpreter.startswith("/") and interpreter.endswith("/bin/python"), (
                        f"{where}: runtime `{runtime}` must be an absolute interpreter path on the shared filesystem"
                    )


# --- one deployment per customer account (deploy/tenancy, deploy/helm/values-lab-a.yaml) ----

TENANCY = DEPLOY / "tenancy"


def _policy(name: str) -> dict[str, Any]:
    doc = json.loads((TENANCY / name).read_text())
    assert doc["Version"] == "2012-10-17" and doc["Statement"], f"{name}: not an IAM policy document"
    return doc


def _lab_a():
    from control_plane.catalog.tenants import load_tenants

    return load_tenants(TENANCY / "tenants-lab-a.yaml").get_tenant("lab-a")


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def test_the_customer_s_tenants_catalog_names_its_bucket_key_and_credentials():
    lab = _lab_a()
    assert lab.storage.startswith("s3://") and lab.key.kind == "aws-kms" and lab.key.key_id.startswith("arn:aws:kms:")
    assert lab.credentials.env == "LAB_A"
    assert lab.agreement.regions and set(lab.limits.regions) <= set(lab.agreement.regions)


def test_the_tenant_storage_policy_names_only_its_prefix_and_its_key():
    lab = _lab_a()
    bucket, prefix = lab.storage.removeprefix("s3://").split("/", 1)
    statements = _policy("iam-tenant-storage-policy.json")["Statement"]
    assert all(s["Effect"] == "Allow" for s in statements)
    actions = {a for s in statements for a in _as_list(s["Action"])}
    assert actions == {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket", "kms:GenerateDataKey", "kms:Decrypt", "kms:DescribeKey"}
    for s in statements:
        resources = _as_list(s["Resource"])
        if any(a.startswith("kms:") for a in _as_list(s["Action"])):
            assert resources == [lab.key.key_id]
        elif s["Action"] == "s3:ListBucket":
            assert resources == [f"arn:aws:s3:::{bucket}"]
            assert s["Condition"] == {"StringLike": {"s3:prefix": [f"{prefix}/*"]}}
        else:
            assert resources == [f"arn:aws:s3:::{bucket}/{prefix}/*"]


def test_the_key_policy_lets_sinewgrid_only_wrap_and_unwrap_for_its_tenant():
    statements = _policy("kms-key-policy.json")["Statement"]
    admins = [s for s in statements if "kms:ScheduleKeyDeletion" in _as_list(s["Action"])]
    assert len(admins) == 1 and "administrators" in admins[0]["Principal"]["AWS"], "the customer's admins manage the key"
    sinewgrid = [s for s in statements if s not in admins]
    for s in sinewgrid:
        principals = _as_list(s["Principal"]["AWS"])
        assert any("sinewgrid-control-plane" in p for p in principals) and any("workload" in p for p in principals)
        actions = set(_as_list(s["Action"]))
        assert actions <= {"kms:GenerateDataKey", "kms:Decrypt", "kms:DescribeKey"}
        if actions & {"kms:GenerateDataKey", "kms:Decrypt"}:
            assert s["Condition"] == {"StringEquals": {"kms:EncryptionContext:tenant": "lab-a"}}
    assert {a for s in sinewgrid for a in _as_list(s["Action"])} == {"kms:GenerateDataKey", "kms:Decrypt", "kms:DescribeKey"}


def test_the_control_plane_role_is_limited_to_this_account_s_bucket_and_key():
    lab = _lab_a()
    bucket = lab.storage.removeprefix("s3://").split("/", 1)[0]
    statements = _policy("iam-control-plane-policy.json")["Statement"]
    for s in statements:
        assert s["Effect"] == "Allow"
        actions = _as_list(s["Action"])
        assert not any(a.endswith("*") or a.startswith(("iam:", "sts:")) for a in actions), f"{s['Sid']}: no wildcard or IAM actions"
        s3_kms = {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket", "kms:GenerateDataKey", "kms:Decrypt", "kms:DescribeKey"}
        assert set(actions) <= s3_kms | {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}
        for resource in _as_list(s["Resource"]):
            queue = resource.startswith(f"arn:aws:sqs:us-east-1:{lab.key.key_id.split(':')[4]}:sinewgrid-drops-")  # the drop events (drop_events.py)
            assert resource == lab.key.key_id or resource.startswith(f"arn:aws:s3:::{bucket}") or queue, f"{s['Sid']}: {resource}"
            assert queue == (set(actions) <= {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}), f"{s['Sid']}: queue actions on queues only"
            assert resource != "*"
        if {"kms:GenerateDataKey", "kms:Decrypt"} & set(actions):
            assert s["Condition"] == {"StringEquals": {"kms:EncryptionContext:tenant": "lab-a"}}


def _strings(node: object) -> list[str]:
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


def test_the_customer_s_helm_values_mount_its_catalog_and_hold_no_secret():
    text = (DEPLOY / "helm" / "values-lab-a.yaml").read_text()
    values = yaml.safe_load(text)
    assert values["serviceAccount"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::111122223333:role/")
    by_name = {d["name"]: d for d in values["dagster-user-deployments"]["deployments"]}
    workspace = _workspace_locations()
    assert set(by_name) <= set(workspace) and "cell" in by_name
    cell = by_name["cell"]
    assert cell["env"]["SINEWGRID_HOME"].startswith("s3://")
    mount = next(m for m in cell["volumeMounts"] if cell["env"]["SINEWGRID_TENANTS"].startswith(m["mountPath"] + "/"))
    volume = next(v for v in cell["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == "sinewgrid-tenants" and mount["readOnly"] is True
    assert {"name": "sinewgrid-tenant-lab-a"} in cell["envSecrets"]
    for deployment in by_name.values():
        # As Kubernetes reads them (camelCase, as the chart passes them on): unknown fields are dropped, so compare back.
        client = kubernetes.client.ApiClient()
        for model, part in (("V1Volume", "volumes"), ("V1VolumeMount", "volumeMounts")):
            for item in deployment.get(part, []):
                read = client._ApiClient__deserialize(item, model)
                assert client.sanitize_for_serialization(read) == item, f"{deployment['name']}: {part} {item} is not a valid {model}"
        assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True
        assert not any(name.endswith(("SECRET_ACCESS_KEY", "ACCESS_KEY_ID", "SESSION_TOKEN", "PASSWORD")) for name in deployment["env"])
    secret_looking = re.compile(r"AKIA[0-9A-Z]{16}|://[^/@\s]+:[^/@\s]+@|^[A-Za-z0-9/+]{40}$")  # an access key id, a URL with a password, a secret key
    assert not [v for v in _strings(values) if secret_looking.search(v)], "no secret value in Helm values: use a Secret"
    # The platform's views read the ledger, not the lab's data.
    assert by_name["platform"]["envSecrets"] == [{"name": "sinewgrid-ledger"}]


def test_a_step_of_the_customer_s_tenant_is_placed_only_in_its_agreed_regions(monkeypatch: pytest.MonkeyPatch):
    from control_plane.placement.ranking import plan_placement
    from control_plane.catalog.step_spec import StepSpec

    monkeypatch.setenv("SINEWGRID_TENANTS", str(TENANCY / "tenants-lab-a.yaml"))
    pools = load_pools(DEPLOY / "pools" / "aws.yaml") | load_pools(DEPLOY / "pools" / "gcp.yaml")
    plan = plan_placement(StepSpec(name="cell.finetune", entry_point="x", tenant="lab-a", capacity="burst"), pools)
    assert plan.ranked and {(p.provider, p.region) for p in plan.ranked} == {("aws", "us-east-1")}
    gcp = [v for v in plan.verdicts if v.pool.startswith("gcp")]
    assert gcp and all("tenant_limits" in v.refused_by for v in gcp)
