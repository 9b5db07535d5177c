"""The load generator: workloads, the streaming client, telemetry, one cell's measurement."""
