"""Planning: a pure function from (cluster, strategy, options) to a Plan of task specs."""

from ddlctl.planning.plan import (
    MULTI_HOST_STRATEGIES,
    SINGLE_HOST_STRATEGIES,
    STRATEGIES,
    LaunchRequest,
    Placement,
    Plan,
    TaskSpec,
    layout,
    make_plan,
)

__all__ = [
    "MULTI_HOST_STRATEGIES",
    "SINGLE_HOST_STRATEGIES",
    "STRATEGIES",
    "LaunchRequest",
    "Placement",
    "Plan",
    "TaskSpec",
    "layout",
    "make_plan",
]
