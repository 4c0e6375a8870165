"""The model gateway: a task over many items, routed to the cheapest model provider that meets the
task's bar, through LiteLLM, with budgets, data agreements and the ledger enforced before
anything leaves. Stand-in providers for demos and tests live outside the product, in
`testbed/model_providers/`."""
