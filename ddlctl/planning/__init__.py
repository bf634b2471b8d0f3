"""Planning: a pure function from (cluster, strategy, options) to a Plan of task specs."""

from ddlctl.contract.strategies import MULTI_HOST_STRATEGIES, SINGLE_HOST_STRATEGIES, STRATEGIES
from ddlctl.planning.placement import layout
from ddlctl.planning.plan import Plan, TaskSpec, make_plan
from ddlctl.planning.request import LaunchRequest, Placement

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
