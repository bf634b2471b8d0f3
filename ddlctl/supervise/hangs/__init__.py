"""The hang watch: progress thresholds (watch), blame from stacks and activity (blame, activity), and tasks
at work before their first step (preparing)."""
