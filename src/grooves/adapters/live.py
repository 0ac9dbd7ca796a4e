"""Moved to `grooves.serve.routing`; kept for compatibility."""

from grooves.serve.routing import (
    AdapterConflict,
    AdapterHost,
    AdapterTable,
    Route,
    UnknownModel,
    check_adapter_fits,
)

__all__ = ["AdapterConflict", "AdapterHost", "AdapterTable", "Route", "UnknownModel", "check_adapter_fits"]
