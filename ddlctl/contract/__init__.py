"""The vocabulary every side shares - controller, host agents, tasks: environment variables, strategies and
their facts, the fault vocabulary, run-directory names, the wire format, the telemetry schema, errors.
Standard library only; imports nothing else of ddlctl."""
