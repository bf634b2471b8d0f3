"""The test harness that tests and benchmarks share: fake host agents for the supervisor, OpenSSH test
hosts, a Slurm test cluster, a launched job to cause faults in, and running the real command."""
