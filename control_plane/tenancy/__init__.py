"""Tenants: isolated storage, customer-held keys (envelope encryption) and data agreements (docs/tenancy.md)."""
