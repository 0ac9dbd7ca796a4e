"""Moved to `grooves.serve.routing`; kept for compatibility."""

from grooves.serve.routing import AdapterConflict, AdapterTable, Route, UnknownModel, check_adapter_fits

__all__ = ["AdapterConflict", "AdapterTable", "Route", "UnknownModel", "check_adapter_fits"]
