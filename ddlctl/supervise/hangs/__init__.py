"""ddlctl.supervise.hangs.blame."""
