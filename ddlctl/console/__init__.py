"""What people see while a job runs: task output prefixed and collapsed, the live table, the Prometheus
metrics endpoint, a stdout whose reader went away."""
