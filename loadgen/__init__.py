"""Plaza load generator, profiler, scheduling simulator and benchmark reports."""
