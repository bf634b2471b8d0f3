"""ddlctl.console."""
