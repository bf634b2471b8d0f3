"""The one place that calls NVML (package ``nvidia-ml-py``, module ``pynvml``).

No library, no driver or no GPU is a normal state, reported as a note, never raised. Callers
never see an NVML exception.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_total_bytes: int | None
    uuid: str | None = None


@dataclass(frozen=True)
class GpuInventory:
    """GPUs on this host, the driver version, or why there are none (``note``)."""

    gpus: tuple[GpuInfo, ...]
    driver: str | None
    note: str | None = None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _query(func, *args, default=None):  # noqa: ANN001, ANN202 - thin NVML wrapper
    """Call an NVML function; an unsupported or failing metric becomes ``default``."""
    import pynvml

    try:
        return func(*args)
    except pynvml.NVMLError:
        return default


def inventory() -> GpuInventory:
    """What NVML sees on this host (never raises)."""
    try:
        import pynvml
    except ImportError:
        return GpuInventory((), None, "nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return GpuInventory((), None, f"no NVIDIA GPU (NVML: {_text(exc)})")
    except OSError as exc:  # library present but not loadable
        return GpuInventory((), None, f"no NVIDIA GPU ({exc})")
    try:
        driver = _query(pynvml.nvmlSystemGetDriverVersion)
        count = _query(pynvml.nvmlDeviceGetCount, default=0)
        gpus = []
        for index in range(count):
            handle = _query(pynvml.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                continue
            memory = _query(pynvml.nvmlDeviceGetMemoryInfo, handle)
            gpus.append(GpuInfo(index=index, name=_text(_query(pynvml.nvmlDeviceGetName, handle, default="?")),
                                memory_total_bytes=getattr(memory, "total", None),
                                uuid=_text(_query(pynvml.nvmlDeviceGetUUID, handle, default="")) or None))
        note = None if gpus else "NVML found no GPU"
        return GpuInventory(tuple(gpus), _text(driver) if driver else None, note)
    finally:
        _query(pynvml.nvmlShutdown)
