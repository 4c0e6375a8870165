"""LabStandIn — a stand-in for the wet lab, for demos and tests only.

It answers a plate worklist from the outbox with a new drop in landing, exactly as a
lab system would, with readouts drawn from a hidden ground truth plus noise. The truth
comes from the genes' own co-expression programme in the PBMC matrix (their loadings
on its leading principal components), so a model that learns good gene embeddings
can learn it. Nothing in the platform reads the truth; only this module knows it.

A stand-in is one lab, a tenant of the platform: it works on that tenant's own storage root
(`tenants/<lab>/` under the platform's, `LabStandIn.of_tenant`), drops its plates in that
root's landing zone and answers that root's outbox. Like a real lab it holds no key of ours:
what it writes and reads there is plain.
"""

from __future__ import annotations

import io
import posixpath
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from cell_lane.omics import load_reference_expression
from cell_lane.plate_layout import GENES_PER_PLATE, plate_layout
from control_plane.catalog.tenants import load_tenants
from control_plane.intake.landing import MANIFEST_NAME, write_drop
from workload_runtime.storage import Storage, exists, fs_for, read_json, sha256_bytes, write_json_atomic

ASSAY_KIND = "assays"
NEG_CONTROL_MEAN, NEG_CONTROL_SD = 1000.0, 40.0
POS_CONTROL_MEAN, POS_CONTROL_SD = 250.0, 30.0


@dataclass
class LabStandIn:
    storage: Storage  # the lab's (tenant's) own storage root
    seed: int = 7
    noise_sd: float = 0.08  # per well, in effect units (1 = a full positive-control effect)
    tenant: str = ""  # the lab's name, for what it prints

    @classmethod
    def of_tenant(cls, platform_root: str, tenant: str, seed: int = 7) -> "LabStandIn":
        """The stand-in of one lab of the tenants catalog, on its root under `platform_root`."""
        root = load_tenants().get_tenant(tenant).root(Storage.at(platform_root).root)
        return cls(Storage.at(root), seed=seed, tenant=tenant)

    @cached_property
    def truth(self) -> pd.Series:
        """Hidden effect of knocking down each gene (0 = no effect, 1 = like the positive control)."""
        adata = load_reference_expression()
        x = adata.X.toarray().astype(np.float64)  # 700 × 748: small enough to densify
        centred = x - x.mean(axis=0)
        # Gene loadings on the two leading programmes of the cell × gene matrix.
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        loadings = vt[:2].T * np.sqrt(adata.n_vars)
        effect = 0.35 + 0.5 * np.tanh(loadings[:, 0]) - 0.3 * np.tanh(loadings[:, 1])
        return pd.Series(effect, index=adata.var_names, name="true_effect")

    def _readouts(self, table: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
        table = table.copy()
        span = POS_CONTROL_MEAN - NEG_CONTROL_MEAN
        for i, row in table.iterrows():
            kind = row["sample_type"]
            if kind == "neg_ctrl":
                value = rng.normal(NEG_CONTROL_MEAN, NEG_CONTROL_SD)
            elif kind == "pos_ctrl":
                value = rng.normal(POS_CONTROL_MEAN, POS_CONTROL_SD)
            elif kind == "sample":
                effect = self.truth[row["perturbation"]] + rng.normal(0.0, self.noise_sd)
                value = NEG_CONTROL_MEAN + effect * span
            else:
                value = np.nan
            table.at[i, "readout"] = round(max(float(value), 0.0), 2) if not np.isnan(value) else np.nan
        return table

    def _drop(self, drop_id: str, tables: dict[str, pd.DataFrame], note: str, **fields: str) -> str:
        if exists(posixpath.join(self.storage.landing(ASSAY_KIND, drop_id), MANIFEST_NAME)):
            return self.storage.landing(ASSAY_KIND, drop_id)  # a lab never sends the same drop twice
        files = {name: table.to_csv(index=False).encode() for name, table in tables.items()}
        return write_drop(
            self.storage, ASSAY_KIND, drop_id, files,
            assay="CRISPRi viability (simulated)", instrument="LabStandIn plate reader", project="sinewgrid-demo", note=note, **fields,
        )

    def seed_drops(self, plates: int = 2, include_bad: bool = True) -> list[str]:
        """First-round drops: random genes, as a lab would start; plus one deliberately bad drop."""
        rng = np.random.default_rng(self.seed)
        genes = list(rng.choice(self.truth.index.to_numpy(), size=plates * GENES_PER_PLATE, replace=False))
        drop_ids = []
        for p in range(plates):
            barcode = f"SEED-{p + 1:03d}"
            chosen = genes[p * GENES_PER_PLATE : (p + 1) * GENES_PER_PLATE]
            table = self._readouts(plate_layout(chosen, barcode), rng)
            drop_id = f"seed-plate-{p + 1:03d}"
            self._drop(drop_id, {f"plates/{barcode}.csv": table}, "initial screen, random genes")
            drop_ids.append(drop_id)
        if include_bad:
            table = self._readouts(plate_layout(genes[:GENES_PER_PLATE], "SEED-BAD"), rng)
            table.loc[5, "well"] = table.loc[4, "well"]  # a duplicated well, as a pipetting-robot export bug would
            table["readout"] = table["readout"].astype(object)
            table.loc[20, "readout"] = "OVER"  # a reader's overflow flag instead of a number
            drop_id = "seed-plate-bad-export"
            self._drop(drop_id, {"plates/SEED-BAD.csv": table}, "an export with a duplicated well and an overflow flag")
            drop_ids.append(drop_id)
        return drop_ids

    def answered(self) -> set[str]:
        fs, path = fs_for(self.storage.uri("lab_simulator", "answered.json"))
        return set(read_json(self.storage.uri("lab_simulator", "answered.json"))) if fs.exists(path) else set()

    def answer_outbox(self) -> list[str]:
        """Run every worklist in the outbox not answered yet; each becomes a new drop in landing."""
        fs, base = fs_for(self.storage.outbox("plates"))
        if not fs.exists(base):
            return []
        done = self.answered()
        new_drops = []
        for worklist in sorted(fs.glob(posixpath.join(base, "*", "worklist.csv"))):
            proposal_id = posixpath.basename(posixpath.dirname(worklist))
            if proposal_id in done:
                continue
            table = pd.read_csv(io.BytesIO(fs.cat_file(worklist)), keep_default_na=False, na_values=[""])
            table["perturbation"] = table["perturbation"].fillna("")
            rng = np.random.default_rng([self.seed, int(sha256_bytes(proposal_id.encode())[:8], 16)])
            barcode = str(table["plate_barcode"].iloc[0])
            drop_id = f"lab-{proposal_id}"
            self._drop(drop_id, {f"plates/{barcode}.csv": self._readouts(table, rng)}, f"results for worklist {proposal_id}", in_reply_to=f"cell/next_plate_proposal/{proposal_id}")
            done.add(proposal_id)
            new_drops.append(drop_id)
        write_json_atomic(self.storage.uri("lab_simulator", "answered.json"), sorted(done))
        return new_drops
