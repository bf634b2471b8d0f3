"""Errors a person can act on.

Anything raised as a :class:`UserError` is printed by the CLI as one clear message (with a hint)
and turned into an exit code; it never reaches the user as a traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input or environment, not a bug in ddlctl.

    ``message`` says what is wrong (naming the file, line, host or task), ``hint`` what to do.
    """

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class ConfigError(UserError):
    """A hosts file, template or option combination that cannot be used."""


class PlanError(UserError):
    """A request that cannot be laid out on the given cluster (e.g. more tasks than slots)."""


class LaunchError(UserError):
    """Something that stopped the launch before or while tasks were starting."""

    exit_code = 1


class HostGoneError(LaunchError):
    """A host that cannot come back, so retrying is pointless (e.g. its Slurm job has ended)."""
