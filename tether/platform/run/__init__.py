"""The run: the loop, its stages, the workers, alarms' responses, recovery and checkpoints."""
