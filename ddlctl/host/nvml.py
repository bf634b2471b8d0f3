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
    sm_clock_max_mhz: int | None = None
    power_limit_w: float | None = None


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
            limit = _query(pynvml.nvmlDeviceGetEnforcedPowerLimit, handle)
            gpus.append(GpuInfo(index=index, name=_text(_query(pynvml.nvmlDeviceGetName, handle, default="?")),
                                memory_total_bytes=getattr(memory, "total", None),
                                uuid=_text(_query(pynvml.nvmlDeviceGetUUID, handle, default="")) or None,
                                sm_clock_max_mhz=_query(pynvml.nvmlDeviceGetMaxClockInfo, handle,
                                                        pynvml.NVML_CLOCK_SM),
                                power_limit_w=None if limit is None else limit / 1000.0))
        note = None if gpus else "NVML found no GPU"
        return GpuInventory(tuple(gpus), _text(driver) if driver else None, note)
    finally:
        _query(pynvml.nvmlShutdown)


class GpuSampler:
    """Samples every GPU of this host; NVML initialised once, device handles cached.

    ``sample()`` returns one dict per GPU with ``util`` (% of time a kernel ran), ``mem_util``,
    ``sm_active`` (% of SMs busy, from GPM on Hopper and newer; None elsewhere), ``mem_used`` and
    ``mem_total`` (bytes, v2 API when available), ``power_w``, ``sm_clock_mhz``, ``temp_c``,
    ``throttle`` (clock-event reason bit mask), ``pcie_tx_kbs``/``pcie_rx_kbs``. A metric the GPU
    does not support is None. With no NVML or no GPU, ``gpus`` is empty and ``note`` says why.
    """

    def __init__(self) -> None:
        self.note: str | None = None
        self.handles: list[tuple[int, object]] = []
        self.gpm: dict[int, list[object]] = {}
        self.inventory = inventory()  # also tells whether NVML works at all
        if not self.inventory.gpus:
            self.note = self.inventory.note
            return
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        for gpu in self.inventory.gpus:
            handle = _query(pynvml.nvmlDeviceGetHandleByIndex, gpu.index)
            if handle is None:
                continue
            self.handles.append((gpu.index, handle))
            support = _query(pynvml.nvmlGpmQueryDeviceSupport, handle)
            if support is not None and getattr(support, "isSupportedDevice", 0):
                first = _query(pynvml.nvmlGpmSampleAlloc)
                second = _query(pynvml.nvmlGpmSampleAlloc)
                if first is not None and second is not None and \
                        _query(pynvml.nvmlGpmSampleGet, handle, first) is not None:
                    self.gpm[gpu.index] = [first, second]

    @property
    def gpus(self) -> tuple[GpuInfo, ...]:
        return self.inventory.gpus

    def _sm_active(self, index: int, handle: object) -> float | None:
        samples = self.gpm.get(index)
        if samples is None:
            return None
        nvml = self._nvml
        previous, current = samples
        if _query(nvml.nvmlGpmSampleGet, handle, current) is None:
            return None
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1 = previous
        request.sample2 = current
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        result = _query(nvml.nvmlGpmMetricsGet, request)
        samples.reverse()  # the current sample is the next tick's previous one
        if result is None or result.metrics[0].nvmlReturn != 0:
            return None
        return round(float(result.metrics[0].value), 2)

    def sample(self) -> list[dict[str, object]]:
        """One reading of every GPU (one round of NVML calls)."""
        if not self.handles:
            return []
        nvml = self._nvml
        readings = []
        for index, handle in self.handles:
            util = _query(nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = _query(nvml.nvmlDeviceGetMemoryInfo, handle, nvml.nvmlMemory_v2) or \
                _query(nvml.nvmlDeviceGetMemoryInfo, handle)
            power = _query(nvml.nvmlDeviceGetPowerUsage, handle)
            reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nvml.nvmlDeviceGetCurrentClocksThrottleReasons
            readings.append({
                "index": index,
                "util": getattr(util, "gpu", None),
                "mem_util": getattr(util, "memory", None),
                "sm_active": self._sm_active(index, handle),
                "mem_used": getattr(memory, "used", None),
                "mem_total": getattr(memory, "total", None),
                "power_w": None if power is None else power / 1000.0,
                "sm_clock_mhz": _query(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
                "temp_c": _query(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
                "throttle": _query(reasons, handle),
                "pcie_tx_kbs": _query(nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_TX_BYTES),
                "pcie_rx_kbs": _query(nvml.nvmlDeviceGetPcieThroughput, handle, nvml.NVML_PCIE_UTIL_RX_BYTES),
            })
        return readings

    def compute_pids(self) -> dict[int, list[int]]:
        """Each GPU's compute processes (pids as NVML reports them: the host's; inside a container
        they may not be the container's own), for telling which task uses which GPU."""
        found: dict[int, list[int]] = {}
        for index, handle in self.handles:
            procs = _query(self._nvml.nvmlDeviceGetComputeRunningProcesses, handle, default=[]) or []
            found[index] = sorted({int(p.pid) for p in procs if getattr(p, "pid", None)})
        return found

    def close(self) -> None:
        if not self.handles:
            return
        for samples in self.gpm.values():
            for sample in samples:
                _query(self._nvml.nvmlGpmSampleFree, sample)
        _query(self._nvml.nvmlShutdown)
        self.handles = []
