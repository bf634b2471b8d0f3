"""ddlctl.commands."""
