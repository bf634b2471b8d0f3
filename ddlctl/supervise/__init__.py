"""Supervision: one loop that owns every task process, its output and its teardown."""
