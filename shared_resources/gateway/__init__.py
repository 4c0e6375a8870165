"""The model gateway: tasks routed to model providers through LiteLLM; `standins/` holds
stand-in providers on loopback for demos and tests."""
