"""Adapters after training: a run's registry, export (merge), weight drift, multi-adapter serving
with atomic promotion and rollback."""
