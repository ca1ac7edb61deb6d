"""Every external name Plaza uses: Kafka topics, consumer groups, headers, Redis keys.

Nothing else spells these inline. A ``Names`` value carries the per-deployment prefixes
(tests give each test its own), so two deployments can share one Kafka and one Redis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from plaza.errors import InvalidInput

_LEVEL_MARK = ".p"
"""Separates a request topic from its priority level (``plaza.infer.mlp.p2``)."""

MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
CONFIG_NAME_PATTERN = r"^([A-Za-z0-9_-][A-Za-z0-9_.-]*)?$"
"""A ``model_config_name``: empty, or a file stem (``configs/<name>.pbtxt``) that leads
nowhere else."""
"""Model names: a path component and a Kafka topic fragment, never '..' or a slash."""

# Kafka record headers (values are UTF-8 bytes).
HEADER_ENVELOPE_VERSION = "plaza-v"
HEADER_CORRELATION_ID = "plaza-id"
HEADER_CONTENT_TYPE = "content-type"
CONTENT_TYPE_MSGPACK = b"application/x-msgpack"
HEADER_ERROR_CODE = "plaza-error-code"
HEADER_ERROR_MESSAGE = "plaza-error"
HEADER_SOURCE_TOPIC = "plaza-source-topic"
HEADER_SOURCE_PARTITION = "plaza-source-partition"
HEADER_SOURCE_OFFSET = "plaza-source-offset"
HEADER_ORIGINAL_SIZE = "plaza-original-size"
"""On a dead letter sent without its value (too big to forward): the value's size in bytes."""

# Field names inside Redis stream entries.
STREAM_FIELD_RESULTS = b"r"
STREAM_FIELD_COUNT = b"n"

# Prometheus metric names: Triton's where Triton has the metric (same meaning, same units).
METRIC_REQUEST_SUCCESS = "nv_inference_request_success"
METRIC_REQUEST_FAILURE = "nv_inference_request_failure"
METRIC_INFERENCE_COUNT = "nv_inference_count"
METRIC_EXEC_COUNT = "nv_inference_exec_count"
METRIC_PENDING_REQUESTS = "nv_inference_pending_request_count"
METRIC_REQUEST_DURATION_US = "nv_inference_request_duration_us"
METRIC_QUEUE_DURATION_US = "nv_inference_queue_duration_us"
METRIC_COMPUTE_INPUT_DURATION_US = "nv_inference_compute_input_duration_us"
METRIC_COMPUTE_INFER_DURATION_US = "nv_inference_compute_infer_duration_us"
METRIC_COMPUTE_OUTPUT_DURATION_US = "nv_inference_compute_output_duration_us"
METRIC_FIRST_RESPONSE_HISTOGRAM = "nv_inference_first_response_histogram_ms"
"""A decoupled model's time to its requests' first responses (Triton's name)."""
METRIC_GPU_UTILIZATION = "nv_gpu_utilization"
METRIC_GPU_MEMORY_USED = "nv_gpu_memory_used_bytes"
METRIC_GPU_MEMORY_TOTAL = "nv_gpu_memory_total_bytes"
METRIC_GPU_POWER_USAGE = "nv_gpu_power_usage"
METRIC_GPU_POWER_LIMIT = "nv_gpu_power_limit"
METRIC_GPU_ENERGY = "nv_energy_consumption"
METRIC_CPU_UTILIZATION = "nv_cpu_utilization"
METRIC_CPU_MEMORY_USED = "nv_cpu_memory_used_bytes"
METRIC_CPU_MEMORY_TOTAL = "nv_cpu_memory_total_bytes"
METRIC_BATCH_SIZE = "plaza_inference_batch_size"
METRIC_CONSUMER_LAG = "plaza_kafka_consumer_lag"
METRIC_SEQUENCES_ACTIVE = "plaza_sequences_active"
METRIC_WORKER_RECORDS = "plaza_worker_records"
METRIC_CACHE_HITS = "nv_cache_num_hits_per_model"
METRIC_CACHE_MISSES = "nv_cache_num_misses_per_model"
METRIC_CACHE_HIT_DURATION_US = "nv_cache_hit_duration_per_model"
METRIC_CACHE_MISS_DURATION_US = "nv_cache_miss_duration_per_model"
LABEL_MODEL = "model"
LABEL_VERSION = "version"
LABEL_REASON = "reason"
LABEL_GPU_UUID = "gpu_uuid"
LABEL_TOPIC = "topic"
LABEL_PARTITION = "partition"
LABEL_OUTCOME = "outcome"


def check_model_name(name: str) -> str:
    """Return ``name`` if it is a valid model name, else raise InvalidInput."""
    if not MODEL_NAME_RE.fullmatch(name) or ".." in name:
        raise InvalidInput(
            f"invalid model name {name!r}: letters, digits, '_', '-', '.' only", model=name
        )
    return name


_VERSION_FOLDER_RE = re.compile(r"[1-9][0-9]*")


def folder_version(name: str) -> int | None:
    """The model version a subfolder of a model's folder holds, as Triton reads it: its
    name as a number in ASCII digits with no leading zero (``1``, ``12``); None for any
    other folder (``0``, ``01``, ``v2``, other scripts' digits), which is ignored."""
    return int(name) if _VERSION_FOLDER_RE.fullmatch(name) else None


def step_request_id(ensemble_request_id: str, step_index: int, branch: int | None = None) -> str:
    """The correlation id of an ensemble request's step: ``<request id>.<step index>``, or
    ``<request id>.<step index>.<branch>`` for a step run once per response of a decoupled
    step (``branch``: that response's index).

    Deterministic, so a replayed ensemble request finds its steps' stored answers."""
    if branch is None:
        return f"{ensemble_request_id}.{step_index}"
    return f"{ensemble_request_id}.{step_index}.{branch}"


@dataclass(frozen=True, slots=True)
class Names:
    """Names for one deployment, built from its topic and key prefixes."""

    topic_prefix: str = "plaza."
    key_prefix: str = "plaza:"

    # -- Kafka ---------------------------------------------------------------------------
    def request_topic(self, model: str, level: int = 0) -> str:
        """The topic of ``model``'s priority ``level`` (a settled level, see plaza.priority).

        Level 0 (a model without levels) and level 1 use the base topic; level N > 1 its
        ``.pN`` topic. ``topic_level`` is the inverse.
        """
        base = f"{self.topic_prefix}infer.{check_model_name(model)}"
        return base if level <= 1 else f"{base}{_LEVEL_MARK}{level}"

    def request_topics(self, model: str, levels: int) -> list[str]:
        """Every request topic of a model with ``levels`` priority levels, highest first."""
        return [self.request_topic(model, lv) for lv in range(1, max(levels, 1) + 1)]

    def topic_level(self, model: str, topic: str) -> int:
        """The priority level ``model``'s request ``topic`` carries: N for its ``.pN``
        topic, 0 for its base topic (level 1, or no levels: the envelope's priority then
        decides). InvalidInput for a topic that is not one of the model's request topics."""
        base = self.request_topic(model)
        tail = topic.removeprefix(f"{base}{_LEVEL_MARK}")
        if topic == base:
            return 0
        level = int(tail) if tail.isascii() and tail.isdigit() else 0
        if level > 1 and self.request_topic(model, level) == topic:
            return level
        raise InvalidInput(f"{topic!r} is not a request topic of model {model!r}", model=model)

    def dead_letter_topic(self, model: str) -> str:
        return f"{self.topic_prefix}dlq.{check_model_name(model)}"

    def consumer_group(self, model: str) -> str:
        """The consumer group every worker of ``model`` joins."""
        return f"{self.topic_prefix}workers.{check_model_name(model)}"

    # -- Redis ---------------------------------------------------------------------------
    def result_key(self, correlation_id: str) -> str:
        """Holds one request's result (first write wins); polled by async clients.

        The correlation id is the key's hash tag (``{...}``), as in ``job_key``: on a Redis
        Cluster both keys of one request live in one hash slot."""
        return f"{self.key_prefix}result:{{{correlation_id}}}"

    def response_key(self, correlation_id: str, index: int) -> str:
        """Holds response ``index`` of a decoupled model's request, all but its final one
        (that one is the request's result key): first write wins per response, so a
        replayed request adds only the responses its first run did not write. Same hash
        tag as the result key."""
        return f"{self.key_prefix}response:{{{correlation_id}}}:{index}"

    def answer_key(self, correlation_id: str, index: int, final: bool) -> str:
        """Where a response is stored: the result key for a final one (every ordinary
        answer), else its ``response_key``."""
        if final:
            return self.result_key(correlation_id)
        return self.response_key(correlation_id, index)

    def job_key(self, correlation_id: str) -> str:
        """Marks a submitted async job as known (so polling can say 'pending')."""
        return f"{self.key_prefix}job:{{{correlation_id}}}"

    def response_cache_key(self, model: str, slot: int) -> str:
        """One of a model's response cache slots (``plaza.response_cache``): no hash tag,
        since every cache command touches this one key (and the slots of a model should
        spread over a Redis Cluster's nodes)."""
        return f"{self.key_prefix}cache:{check_model_name(model)}:{slot}"

    def reply_stream(self, gateway_id: str) -> str:
        """A gateway's (or SDK client's) private reply stream for synchronous calls."""
        return f"{self.key_prefix}replies:{gateway_id}"

    def results_stream(self, name: str) -> str:
        """A named result stream for batch pipelines (consumed with XREADGROUP)."""
        return f"{self.key_prefix}stream:{name}"

    def worker_registry_key(self, model: str) -> str:
        """Sorted set of a model's live workers (an ensemble's: its runners), scored by when
        their heartbeat expires."""
        return f"{self.key_prefix}workers:{check_model_name(model)}"

    def worker_info_key(self, worker_id: str) -> str:
        """A worker's self-description (model, versions, host, pid), with a short TTL."""
        return f"{self.key_prefix}worker-info:{worker_id}"

    def log_settings_key(self) -> str:
        """The deployment's log settings (Triton's logging extension, ``plaza.log_settings``):
        one JSON string, which every process applies when it changes."""
        return f"{self.key_prefix}log_settings"

    def model_table_key(self) -> str:
        """Hash of the models the deployment should serve: the model control table
        (``plaza.model_control``; one field per model, so it is bounded by the repository)."""
        return f"{self.key_prefix}models"

    def model_stats_key(self, model: str, version: str) -> str:
        """Hash of one model version's cumulative statistics, summed over its workers.

        The model name is the hash tag: a worker flushes all its versions' hashes in one
        script call, which on a Redis Cluster must touch keys of one hash slot."""
        return f"{self.key_prefix}stats:{{{check_model_name(model)}}}:{version}"

    def reply_stream_prefixes(self) -> tuple[str, ...]:
        """Where a request may ask for its answer to go: a reply stream (``reply_stream``)
        or a named result stream (``results_stream``) of this deployment, nowhere else."""
        return (self.reply_stream(""), self.results_stream(""))

    def is_reply_stream(self, name: str) -> bool:
        """Whether ``name`` is a stream a worker may write a request's answer to."""
        return any(name.startswith(p) and len(name) > len(p) for p in self.reply_stream_prefixes())

    def sequence_state_key(self, model: str, version: int, sequence_id: int | str) -> str:
        """A stateful model's sequence: its implicit state after its last answered request,
        kept while it runs, so that the next owner of its partition goes on from there
        (``workers/sequences.py``). Each version of the model has its own sequences, and an
        integer id and a string id are different sequences."""
        kind = "i" if isinstance(sequence_id, int) else "s"
        model = check_model_name(model)
        return f"{self.key_prefix}sequence:{model}:{version}:{kind}:{sequence_id}"

    def answer_state_key(self, correlation_id: str) -> str:
        """On a Redis Cluster, the state a stateful model's request left, stored with its
        answer in one script call (same hash tag as the result key): what the sequence's
        next request runs on when the answer was stored but the sequence's own key was not
        updated (a worker that died in between; ``workers/sequences.py``)."""
        return f"{self.key_prefix}answer-state:{{{correlation_id}}}"

    def delivery_key(self, topic: str, partition: int, offset: int) -> str:
        """Counts how often one Kafka record was delivered to a worker without an answer
        (a record that crashes every worker that takes it is dead-lettered past a limit)."""
        return f"{self.key_prefix}deliveries:{topic}:{partition}:{offset}"
