"""ddlctl.supervise.recovery."""
