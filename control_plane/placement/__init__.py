"""Placement: which pools can run a step and in what order (with the evidence), what it costs,
and whole calendars of steps planned over quotas."""
