"""One module per subcommand's work (launch, compare, check, stop, partition, submit, report) and what they
share (the launch's options, pre-flight checks, device measurements). The CLI parses and calls these."""
