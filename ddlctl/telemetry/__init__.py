"""Telemetry: GPU figures through NVML, host figures through psutil."""
