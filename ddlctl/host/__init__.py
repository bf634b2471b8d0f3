"""ddlctl.host."""
