"""ddlctl.diagnose."""
