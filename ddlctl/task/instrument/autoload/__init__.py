"""ddlctl.task.instrument.autoload."""
