"""The telemetry sample's schema: what the telemetry agent (:mod:`ddlctl.host.telemetry`) writes
and the live view, the metrics endpoint, the hang watch and the report read. Standard library only."""

from __future__ import annotations

#: Order of the values in an agent sample's per-GPU arrays (declared in its ``hello`` line).
GPU_FIELDS: tuple[str, ...] = ("index", "util", "mem_util", "sm_active", "mem_used", "mem_total", "power_w",
                               "sm_clock_mhz", "temp_c", "throttle", "pcie_tx_kbs", "pcie_rx_kbs")


def gpu_reading(entry: object, fields: tuple[str, ...] | list[str] = GPU_FIELDS) -> dict[str, object]:
    """One GPU reading of a sample as a dict, whether it was written as an array or a dict."""
    if isinstance(entry, dict):
        return entry
    return dict(zip(fields, entry, strict=False))  # type: ignore[call-overload]
