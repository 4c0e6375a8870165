"""A workload run by hand (outside Dagster): its inputs from `--extras FILE.json` or
`$SINEWGRID_WORKLOAD_EXTRAS`, and its reports to stderr instead of Dagster Pipes. A gang's
other ranks report this way too (rank 0 alone talks to Pipes)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping
from typing import Any

from workload_runtime.inputs import WorkloadInputs
from workload_runtime.node_env import EXTRAS_ENV, node_env


class StandaloneReporter:
    """Stands in for the Pipes context when a workload is run by hand."""

    def __init__(self, extras: Mapping[str, Any], rank: int | None = None, level: int = logging.INFO):
        self.extras = extras
        self.log = logging.getLogger("sinewgrid.workload" if rank is None else f"sinewgrid.workload.rank{rank}")
        if not self.log.handlers:
            handler = logging.StreamHandler(sys.stderr)
            where = "" if rank is None else f"rank {rank}: "
            handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {where}%(message)s"))
            self.log.addHandler(handler)
            self.log.setLevel(level)
        self.messages: list[Any] = []

    def report_custom_message(self, payload: Any) -> None:
        self.messages.append(payload)
        self.log.debug("message: %s", payload)

    def report_asset_materialization(self, metadata: Mapping[str, Any] | None = None, **_: Any) -> None:
        self.log.info("result: %s", json.dumps(metadata, default=str))

    def close(self) -> None:
        pass


def standalone_inputs(argv: list[str]) -> WorkloadInputs:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--extras")
    args, _ = parser.parse_known_args(argv)
    if args.extras:
        with open(args.extras) as fh:
            return WorkloadInputs.from_extras(json.load(fh), where=args.extras)
    if extras := node_env().extras_json:
        return WorkloadInputs.from_extras(json.loads(extras), where=f"${EXTRAS_ENV}")
    raise SystemExit(
        "This workload was started outside Dagster without its settings. Pass "
        f"--extras FILE.json or set {EXTRAS_ENV} to a JSON object with `config`, "
        "`checkpoint_uri` and `checkpoint_every_steps`."
    )
