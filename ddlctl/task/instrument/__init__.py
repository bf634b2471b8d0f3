"""Step-timing instrumentation for programs launched by ddlctl (Keras callback, model.fit hook)."""
