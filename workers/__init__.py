"""The worker process: Kafka intake -> dynamic batcher -> backend -> Redis results."""
