"""ddlctl.contract."""
