"""Queues and quotas: which team may use a pool now (control_plane/catalog/quotas.py holds the
quotas; `admission.py` decides). docs/queues.md is the model and how each engine enforces it."""
