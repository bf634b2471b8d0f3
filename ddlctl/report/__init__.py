"""Reporting: summaries computed from a run directory alone, and their rendering."""
