"""The platform code location: reports that span both lanes (cost and goodput from the ledger)."""
