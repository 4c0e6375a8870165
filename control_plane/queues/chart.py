"""The queues as a chart: each pool's GPUs held by team, its free GPUs, each team's nominal quota
marked, and the GPUs waiting for it (the `gpu_queues` asset)."""

from __future__ import annotations

import io

import numpy as np
from matplotlib.figure import Figure

from control_plane.queues.view import PoolView


def queues_png(views: list[PoolView]) -> bytes:
    figure = Figure(figsize=(max(6.0, 1.1 * len(views) + 2), 4))
    axes = figure.add_subplot()
    names = [v.pool + ("" if v.queued else "\n(not queued)") for v in views]
    teams = sorted({row.team for v in views for row in v.teams if row.used})
    bottom = np.zeros(len(views))
    for team in teams:
        held = np.array([next((r.used for r in v.teams if r.team == team), 0) for v in views], dtype=float)
        axes.bar(names, held, bottom=bottom, label=f"{team} (in use)")
        bottom += held
    axes.bar(names, [max(v.free, 0) for v in views], bottom=bottom, color="#dddddd", label="free")
    waits = [(name, sum(w.gpus for w in v.waiting), v.gpus) for name, v in zip(names, views, strict=True) if v.waiting]
    if waits:  # above the pool's GPUs: what its queue asks for beyond them
        axes.bar([n for n, _, _ in waits], [w for _, w, _ in waits], bottom=[g for _, _, g in waits], color="none", edgecolor="#cc3333", hatch="//", label="waiting (asked for)")
    for x, v in enumerate(views):
        for row in v.teams:
            if row.nominal:
                axes.hlines(row.nominal, x - 0.4, x + 0.4, colors="black", linestyles="dashed", linewidth=0.8)
                axes.annotate(f"{row.team} nominal {row.nominal}", (x, row.nominal), fontsize=6, ha="center", va="bottom")
    axes.set_ylabel("GPUs")
    axes.set_title("GPUs by pool: held by team, free, and waiting", fontsize=10)
    axes.tick_params(axis="x", labelsize=7)
    axes.legend(fontsize=7)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
