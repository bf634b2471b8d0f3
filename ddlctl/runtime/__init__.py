"""Code that runs inside the launched processes (task side), not in the controller."""
