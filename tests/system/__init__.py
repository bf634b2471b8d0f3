"""The system lane: real TensorFlow processes, OpenSSH test hosts, a Slurm test cluster."""
