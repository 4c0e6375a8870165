"""Accounting: one ledger row per attempt (pool, time, productive time, cost, cause) and the
goodput and cost reports read from it."""
