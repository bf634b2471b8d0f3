"""Transports start, signal and stream task processes on a host (local subprocess or SSH)."""

from ddlctl.transport.base import ExitStatus, TaskProcess, Transport

__all__ = ["ExitStatus", "TaskProcess", "Transport"]
