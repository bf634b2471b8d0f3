"""Doing one thing on every host at once: each host gets its result or its error, and one error
message names every host that failed (one bad host never hides the others)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ddlctl.cluster.model import Host
from ddlctl.contract.errors import LaunchError, UserError

T = TypeVar("T")


def each_host(hosts: Sequence[Host], action: Callable[[Host], T], max_parallel: int = 32) -> dict[str, T | LaunchError]:
    """``action(host)`` for every host in parallel (bounded): host label -> result, or the error
    (any exception becomes a :class:`LaunchError` naming the host)."""
    results: dict[str, T | LaunchError] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(hosts)))) as pool:
        futures = [(host, pool.submit(action, host)) for host in hosts]
        for host, future in futures:
            try:
                results[host.label] = future.result()
            except UserError as exc:
                results[host.label] = exc if isinstance(exc, LaunchError) else LaunchError(exc.message, exc.hint)
            except Exception as exc:  # noqa: BLE001 - a broken host is a message, not a traceback
                results[host.label] = LaunchError(f"{host.label} ({host.source}): {type(exc).__name__}: {exc}")
    return results


def all_or_fail(results: Mapping[str, T | LaunchError], what: str, close: Callable[[T], None]) -> dict[str, T]:
    """Every host's result; if any failed, ``close`` the others and raise one :class:`LaunchError`:
    "cannot <what> on N host(s):" and one line per failing host."""
    failures = [r.message for r in results.values() if isinstance(r, LaunchError)]
    done = {label: r for label, r in results.items() if not isinstance(r, LaunchError)}
    if failures:
        for value in done.values():
            close(value)
        noun = "host" if len(failures) == 1 else "hosts"
        raise LaunchError(f"cannot {what} {len(failures)} {noun}:\n  " + "\n  ".join(failures))
    return done
