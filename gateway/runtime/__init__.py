"""What runs while the gateway serves: the assembled parts, the processes, logs and metrics."""
