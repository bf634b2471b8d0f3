"""What a GPU's samples say about how it was used: pure functions over the fields the telemetry
agent already records (util, SM activity, SM clock, clock-event reasons, power, temperature,
memory).

Why these rules (verified on an H100, see DESIGN.md): NVML's ``util`` only says that *a* kernel was
running; a loop of tiny kernels read util 23% with GPM SM activity 0.3%. Under a saturating bf16
matmul the GPU sat at its 700 W limit with the SM clock at 1185-1410 MHz instead of 1980 MHz: the
work was power-capped, not slow code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Clock-event (throttle) reason bits of NVML (``nvmlClocksEventReason*``).
POWER_BITS = 0x4 | 0x80  # SwPowerCap, HwPowerBrakeSlowdown
THERMAL_BITS = 0x8 | 0x20 | 0x40  # HwSlowdown, SwThermalSlowdown, HwThermalSlowdown

BUSY_UTIL = 50.0  # a sample counts as busy from this util on
SMALL_KERNELS_UTIL = 20.0  # util at least this ...
SMALL_KERNELS_RATIO = 0.25  # ... with SM activity below this share of it: kernels too small
CAPPED_SHARE = 0.25  # capped in at least this share of busy samples
CLOCK_DROP = 0.85  # busy SM clock below this share of the maximum counts as held down
POWER_AT_LIMIT = 0.95  # mean busy power at this share of the limit counts as at the limit
MEMORY_FULL = 0.95


@dataclass(frozen=True, slots=True)
class Sample:
    """One GPU reading (any field may be None: not supported by that GPU)."""

    util: float | None = None
    sm_active: float | None = None
    sm_clock_mhz: float | None = None
    throttle: int | None = None
    power_w: float | None = None
    temp_c: float | None = None


@dataclass(frozen=True)
class Throttling:
    """How a GPU's clocks behaved while it was busy."""

    busy_samples: int
    sm_clock_busy_mean_mhz: float | None
    power_busy_mean_w: float | None
    power_capped_share: float | None  # share of busy samples with a power reason set (None: no reasons read)
    thermal_capped_share: float | None
    temp_peak_c: float | None


def throttling(samples: Sequence[Sample]) -> Throttling:
    """Clock, power and throttle-reason figures over the busy samples (util >= ``BUSY_UTIL``)."""
    def column(name: str) -> np.ndarray:
        return np.array([getattr(s, name) for s in samples], dtype=float).reshape(len(samples))

    return throttling_of(column("util"), column("sm_clock_mhz"), column("throttle"), column("power_w"),
                         column("temp_c"))


def throttling_of(util: np.ndarray, sm_clock: np.ndarray, throttle: np.ndarray, power: np.ndarray,
                  temp: np.ndarray) -> Throttling:
    """:func:`throttling` over columns, one value per reading (NaN: not read), as the report parses
    telemetry (hours of samples of many GPUs: column-wise)."""
    busy = util >= BUSY_UTIL  # NaN compares False: a reading without util is not busy
    clocks = sm_clock[busy & ~np.isnan(sm_clock)]
    powers = power[busy & ~np.isnan(power)]
    reasons = throttle[busy & ~np.isnan(throttle)].astype(np.int64)
    temps = temp[~np.isnan(temp)]
    return Throttling(
        busy_samples=int(busy.sum()),
        sm_clock_busy_mean_mhz=float(clocks.mean()) if clocks.size else None,
        power_busy_mean_w=float(powers.mean()) if powers.size else None,
        power_capped_share=float(np.count_nonzero(reasons & POWER_BITS)) / reasons.size if reasons.size else None,
        thermal_capped_share=float(np.count_nonzero(reasons & THERMAL_BITS)) / reasons.size if reasons.size else None,
        temp_peak_c=float(temps.max()) if temps.size else None)


def diagnose_gpu(where: str, util_mean: float | None, sm_active_mean: float | None, throttled: Throttling,
                 sm_clock_max_mhz: float | None, power_limit_w: float | None, mem_peak: float | None,
                 mem_total: float | None) -> list[str]:
    """Lines a person can act on for one GPU (``where``: "GPU 0 on host-a")."""
    lines = []
    if util_mean is not None and sm_active_mean is not None and util_mean >= SMALL_KERNELS_UTIL \
            and sm_active_mean < SMALL_KERNELS_RATIO * util_mean:
        lines.append(f"{where}: kernels too small to fill the GPU: a kernel was running {util_mean:.0f}% of the "
                     f"time, but on average only {sm_active_mean:.1f}% of the SMs were busy (larger batches, "
                     "XLA / fused ops, fewer small kernels)")
    clock_note = ""
    clock = throttled.sm_clock_busy_mean_mhz
    if clock is not None and sm_clock_max_mhz:
        clock_note = f"; SM clock {clock:.0f} of {sm_clock_max_mhz:.0f} MHz while busy"
    held_down = clock is not None and bool(sm_clock_max_mhz) and clock < CLOCK_DROP * sm_clock_max_mhz
    at_limit = (throttled.power_busy_mean_w is not None and bool(power_limit_w)
                and throttled.power_busy_mean_w >= POWER_AT_LIMIT * power_limit_w)
    limit = f" at its {power_limit_w:.0f} W limit" if power_limit_w else ""
    if throttled.busy_samples and throttled.power_capped_share is not None \
            and throttled.power_capped_share >= CAPPED_SHARE:
        lines.append(f"{where} power-capped{limit} in {throttled.power_capped_share:.0%} of busy samples"
                     f"{clock_note} (the work is limited by power, not by the program)")
    elif throttled.busy_samples and at_limit and held_down:
        lines.append(f"{where} power-capped{limit}{clock_note} (the work is limited by power, not by the program)")
    if throttled.busy_samples and throttled.thermal_capped_share is not None \
            and throttled.thermal_capped_share >= CAPPED_SHARE:
        peak = f", peak {throttled.temp_peak_c:.0f} °C" if throttled.temp_peak_c is not None else ""
        lines.append(f"{where} thermally throttled in {throttled.thermal_capped_share:.0%} of busy samples"
                     f"{peak}{clock_note} (check cooling and airflow)")
    if mem_peak and mem_total and mem_peak > MEMORY_FULL * mem_total:
        lines.append(f"{where} memory nearly full: peak {mem_peak / mem_total:.0%} of {mem_total / 2**30:.0f} GiB "
                     "(a larger batch or model will not fit; an out-of-memory error is close)")
    return lines
