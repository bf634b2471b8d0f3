"""ddlctl.task."""
