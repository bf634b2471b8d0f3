"""Restarts (in place, group, everyone), elastic shrink and grow, and the checkpoints a group restart shares."""
