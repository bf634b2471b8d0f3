"""ddlctl.task.instrument."""
