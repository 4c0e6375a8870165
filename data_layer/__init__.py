"""The data layer: dataset versions (git + DVC), lineage records, what assets record about their
results, training runs, and the checkpoint registry with its retention."""
