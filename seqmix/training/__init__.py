"""What a training run needs around the task: checkpoints, callbacks, preemption, run records, dashboards."""
