"""Ingest: a lab drop becomes a raw copy, then a validated plate table — or goes to quarantine."""


import io
import posixpath

import dagster as dg
import pandas as pd

from cell_lane.defs.checks import DROP_MANIFEST_CHECK, LAYOUT_RULES, PLATE_LAYOUT_CHECK, PLATE_SCHEMA_CHECK, Z_PRIME_CHECK
from cell_lane.defs.partitions import tenant_and_drop, lab_drops
from cell_lane.plate_validation import Z_PRIME_THRESHOLD, Violation, check_plate_file, normalised_effects
from control_plane.intake.landing import MANIFEST_NAME, read_drop, write_raw
from workload_runtime.data_issues import DropIssue
from data_layer.provenance import drop_id as drop_lineage_id
from data_layer.provenance import lineage_metadata, publish_version, record_drop
from control_plane.intake.quarantine import quarantined
from control_plane.tenancy.shown import issue_text, table_or_count
from shared_resources.resources import StorageResource
from workload_runtime.storage import exists, read_bytes, read_json, write_bytes_atomic

KIND = "assays"
RAW_ASSAY = dg.AssetKey(["cell", "raw_assay"])
VALIDATED_ASSAY = dg.AssetKey(["cell", "validated_assay"])
MANIFEST_FIELDS = ("assay", "instrument", "project")


def _write_sealed_once(uri: str, data: bytes) -> None:
    """Seal and write a table of the lab's, unless the same table is there already: sealing is not
    deterministic (each object has its own data key), and the registered version must not change."""
    if exists(uri) and read_bytes(uri) == data:
        return
    write_bytes_atomic(uri, data)


def _as_issue(v: Violation) -> DropIssue:
    return DropIssue(v.rule, v.message, v.file, v.row, v.well, v.column)


@dg.asset(
    key=RAW_ASSAY,
    partitions_def=lab_drops,
    group_name="cell_ingest",
    kinds={"csv", "parquet"},
    check_specs=[
        dg.AssetCheckSpec(
            DROP_MANIFEST_CHECK,
            asset=RAW_ASSAY,
            blocking=True,
            description="The drop's manifest is complete and every file matches its sha256 and size.",
        )
    ],
)
def raw_assay(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
    """The lab's plate files exactly as they were sent, copied into the lab's own raw zone.

    One partition per drop a lab sent (`<lab>/<drop_id>`). The copies are sealed with the lab's key; opened,
    they are the lab's bytes exactly, as their checksums show. A drop whose manifest is broken
    or whose files do not match their checksums is copied to quarantine with the reason, and
    stops here.
    """
    tenant, drop_id = tenant_and_drop(context)
    store = storage.for_tenant(tenant)
    manifest, contents, issues = read_drop(store, KIND, drop_id, MANIFEST_FIELDS)
    if issues:
        check = dg.AssetCheckResult(check_name=DROP_MANIFEST_CHECK, passed=False, metadata={"issues": len(issues), "first": issue_text(store.root, issues[0])})
        quarantined(context, store, KIND, drop_id, issues, stage="raw", check_results=[check], metadata={"tenant": tenant})
    where = write_raw(store, KIND, manifest, contents)
    record_drop(store, KIND, drop_id, where, manifest.fields, len(manifest.files), identifiers=MANIFEST_FIELDS)
    files = pd.DataFrame([{"path": f.path, "bytes": f.bytes, "sha256": f.sha256[:16] + "…"} for f in manifest.files])
    return dg.MaterializeResult(
        metadata={
            "status": "accepted",
            "tenant": tenant,
            "raw": dg.MetadataValue.path(where),
            "files": dg.MetadataValue.md(files.to_markdown(index=False)),
            "bytes": sum(f.bytes for f in manifest.files),
            **{k: str(manifest.fields[k]) for k in MANIFEST_FIELDS},
            **lineage_metadata(store, drop_lineage_id(KIND, drop_id)),
        },
        check_results=[dg.AssetCheckResult(check_name=DROP_MANIFEST_CHECK, passed=True, metadata={"files": len(manifest.files)})],
    )


@dg.asset(
    key=VALIDATED_ASSAY,
    deps=[RAW_ASSAY],
    partitions_def=lab_drops,
    group_name="cell_ingest",
    kinds={"pyarrow", "parquet"},
    check_specs=[
        dg.AssetCheckSpec(PLATE_SCHEMA_CHECK, asset=VALIDATED_ASSAY, blocking=True, description="Columns, types and values follow the drop protocol."),
        dg.AssetCheckSpec(PLATE_LAYOUT_CHECK, asset=VALIDATED_ASSAY, blocking=True, description="Valid, unique wells on a 96-, 384- or 1536-well plate, with at least two positive and two negative controls per plate."),
        dg.AssetCheckSpec(Z_PRIME_CHECK, asset=VALIDATED_ASSAY, description="Every plate's Z′-factor (from its controls) is at least 0.5; lower is flagged, not rejected."),
    ],
)
def validated_assay(context: dg.AssetExecutionContext, storage: StorageResource) -> dg.MaterializeResult:
    """Plate results that passed validation, typed and normalised per plate (effect 0 = negative
    control, 1 = positive control) — what the models learn from.

    A plate that breaks a rule sends the whole drop to quarantine with a table of what is
    wrong (file, row, well, rule) and what the lab should do; other drops keep flowing.
    Each valid drop is registered in the lab's own data registry as the dataset version
    `cell/assays@<drop id>`; its tables are sealed with the lab's key.
    """
    tenant, drop_id = tenant_and_drop(context)
    store = storage.for_tenant(tenant)
    raw = store.raw(KIND, drop_id)
    manifest = read_json(posixpath.join(raw, MANIFEST_NAME))
    results = [check_plate_file(read_bytes(posixpath.join(raw, f["path"])), f["path"]) for f in manifest["files"]]
    violations = [v for r in results for v in r.violations]
    tables = [r.table for r in results if r.table is not None]
    if tables and not violations:
        combined = pd.concat(tables, ignore_index=True)
        clash = combined[combined.duplicated(["plate_barcode", "well"], keep=False)]
        for (barcode, well), rows in clash.groupby(["plate_barcode", "well"]):
            files = sorted(set(rows["source_file"]))
            violations.append(
                Violation(files[0], "duplicate_well", f"plate {barcode} well {well} appears in {', '.join(files)}; each well may be reported once per drop.", well=well, plate_barcode=barcode)
            )
    z_primes = {barcode: z for r in results for barcode, z in r.z_primes.items()}
    z_table = pd.DataFrame({"plate_barcode": list(z_primes), "z_prime": [round(z, 3) for z in z_primes.values()]})
    low_z = sorted(b for b, z in z_primes.items() if z < Z_PRIME_THRESHOLD)
    z_check = dg.AssetCheckResult(
        check_name=Z_PRIME_CHECK,
        passed=not low_z and bool(z_primes),
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"z_primes": dg.MetadataValue.md(z_table.to_markdown(index=False) if len(z_table) else "no plate had enough controls"), "below_0_5": ", ".join(low_z) or "none"},
    )
    schema_issues = [_as_issue(v) for v in violations if v.rule not in LAYOUT_RULES]
    layout_issues = [_as_issue(v) for v in violations if v.rule in LAYOUT_RULES]
    checks = [
        dg.AssetCheckResult(check_name=PLATE_SCHEMA_CHECK, passed=not schema_issues, metadata={"issues": len(schema_issues), **({"first": issue_text(store.root, schema_issues[0])} if schema_issues else {})}),
        dg.AssetCheckResult(check_name=PLATE_LAYOUT_CHECK, passed=not layout_issues, metadata={"issues": len(layout_issues), **({"first": issue_text(store.root, layout_issues[0])} if layout_issues else {})}),
        z_check,
    ]
    if violations:
        quarantined(context, store, KIND, drop_id, schema_issues + layout_issues, stage="validation", check_results=checks, metadata={"tenant": tenant})

    table = pd.concat(tables, ignore_index=True)
    effects = normalised_effects(table).assign(drop_id=drop_id)
    curated = store.curated(KIND, drop_id)
    for name, frame in (("plates.parquet", table), ("effects.parquet", effects)):
        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False)
        _write_sealed_once(posixpath.join(curated, name), buffer.getvalue())
    counts = table["sample_type"].value_counts().to_dict()
    _, version = publish_version(
        store, "cell/assays", drop_id, curated, title="validated plate tables of one drop (Parquet)",
        inputs=[drop_lineage_id(KIND, drop_id)], facts={"plates": int(table["plate_barcode"].nunique()), "wells": len(table)}, tenant=tenant,
    )
    if low_z:
        context.log.warning(f"plates with Z′ below {Z_PRIME_THRESHOLD}: {', '.join(low_z)}; their results are used but flagged")
    return dg.MaterializeResult(
        metadata={
            "status": "valid",
            "tenant": tenant,
            "curated": dg.MetadataValue.path(curated),
            "plates": len(z_primes) or table["plate_barcode"].nunique(),
            "wells": len(table),
            "samples": int(counts.get("sample", 0)),
            "genes": int(effects["perturbation"].nunique()),
            "min_z_prime": dg.MetadataValue.float(round(min(z_primes.values()), 3)) if z_primes else dg.MetadataValue.float(float("nan")),
            "preview": table_or_count(store.root, effects.head(10).round(3), "effects (the first 10)", curated),
            **version,
        },
        check_results=checks,
    )
