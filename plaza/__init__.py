"""Plaza's shared core: the wire contract, model configuration, batching policy and naming.

Nothing here imports the workers, the gateway or loadgen; they meet only through this
package, Kafka and Redis.
"""

__version__ = "0.1.0"
