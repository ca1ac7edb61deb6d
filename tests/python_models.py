"""Python-backend models for the tests, written as Triton's documentation writes them.

Each model.py imports only ``triton_python_backend_utils`` (and numpy, json, os): nothing of
Plaza. ``write_repository`` lays them out in Triton's layout under a test's tmp_path, never in
model_repository/ (that is what ``plaza up`` and the other tests serve).
"""

from __future__ import annotations

from pathlib import Path

ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
dynamic_batching { max_queue_delay_microseconds: 200000 }
instance_group [ { kind: KIND_CPU } ]
"""

ADD_SUB_MODEL = '''
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""

    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            sum_ = in_0.as_numpy() + in_1.as_numpy()
            diff = in_0.as_numpy() - in_1.as_numpy()
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", sum_.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", diff.astype(self.output1_dtype))
            inference_response = pb_utils.InferenceResponse(
                output_tensors=[out_tensor_0, out_tensor_1]
            )
            responses.append(inference_response)
        return responses

    def finalize(self):
        print("Cleaning up...")
'''

BLS_CONFIG = """
name: "bls"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

BLS_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Business logic scripting: forwards INPUT0 and INPUT1 to the model named in MODEL_NAME."""

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME")
            model_name_string = model_name.as_numpy()[0][0].decode("utf-8")
            infer_request = pb_utils.InferenceRequest(
                model_name=model_name_string,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[in_0, in_1],
            )
            infer_response = infer_request.exec()
            if infer_response.has_error():
                raise pb_utils.TritonModelException(infer_response.error().message())
            inference_response = pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT0"),
                    pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT1"),
                ]
            )
            responses.append(inference_response)
        return responses
'''

ASYNC_BLS_CONFIG = BLS_CONFIG.replace('name: "bls"', 'name: "async_bls"')

ASYNC_BLS_MODEL = '''
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Async BLS: for each request, two calls to the model named in MODEL_NAME, awaited
    together: (INPUT0, INPUT1) and (INPUT1, INPUT0). OUTPUT0 is the first call's OUTPUT0,
    OUTPUT1 the sum of both calls' OUTPUT1 (x - y + y - x: zeros)."""

    async def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME")
            name = model_name.as_numpy()[0][0].decode("utf-8")
            calls = [
                pb_utils.InferenceRequest(
                    model_name=name,
                    requested_output_names=["OUTPUT0", "OUTPUT1"],
                    inputs=[
                        pb_utils.Tensor("INPUT0", first.as_numpy()),
                        pb_utils.Tensor("INPUT1", second.as_numpy()),
                    ],
                ).async_exec()
                for first, second in ((in_0, in_1), (in_1, in_0))
            ]
            answers = await asyncio.gather(*calls)
            for answer in answers:
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
            out_0 = pb_utils.get_output_tensor_by_name(answers[0], "OUTPUT0").as_numpy()
            diffs = [pb_utils.get_output_tensor_by_name(a, "OUTPUT1").as_numpy() for a in answers]
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", out_0),
                        pb_utils.Tensor("OUTPUT1", diffs[0] + diffs[1]),
                    ]
                )
            )
        return responses
'''

METERED_CONFIG = ADD_SUB_CONFIG.replace('name: "add_sub"', 'name: "metered"')

METERED_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """add_sub's OUTPUT0 and OUTPUT1, and custom metrics: requests by outcome (a counter),
    the last request's row count (a gauge) and the sum of each request's INPUT0 (a
    histogram)."""

    def initialize(self, args):
        requests = pb_utils.MetricFamily(
            name="metered_requests", description="requests by outcome",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.ok = requests.Metric(labels={"outcome": "ok"})
        self.rows = pb_utils.MetricFamily(
            name="metered_rows", description="rows of the last request",
            kind=pb_utils.MetricFamily.GAUGE,
        ).Metric()
        self.sums = pb_utils.MetricFamily(
            name="metered_input_sum", description="sum of INPUT0",
            kind=pb_utils.MetricFamily.HISTOGRAM,
        ).Metric(buckets=[0.0, 10.0, 100.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            self.ok.increment(1)
            self.rows.set(a.shape[0])
            self.sums.observe(float(a.sum()))
            outputs = [pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''

FAULTY_CONFIG = """
name: "faulty"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

FAULTY_MODEL = '''
import os
import time

import triton_python_backend_utils as pb_utils

RAISE = -1.0
EXIT = -2.0
REFUSE = -3.0
HANG = -4.0


class TritonPythonModel:
    """Echoes INPUT0; -1 raises, -2 ends the process at once, -3 answers a TritonError,
    -4 never returns."""

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if value[0] == RAISE:
                raise pb_utils.TritonModelException("INPUT0 must not be -1")
            if value[0] == EXIT:
                os._exit(7)
            if value[0] == HANG:
                time.sleep(3600)
            if value[0] == REFUSE:
                code = pb_utils.TritonError.INVALID_ARG
                error = pb_utils.TritonError("INPUT0 -3 is refused", code)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", value)])
            )
        return responses
'''

META_CONFIG = """
name: "meta"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "REQUEST_ID" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "PARAMETERS" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "OUTPUTS" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "ARGS" data_type: TYPE_STRING dims: [ 1 ] }
]
parameters [ { key: "greeting" value: { string_value: "hello" } } ]
"""

META_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers with what it was given: request ids, parameters, requested outputs, the
    number of requests in its execute call, and initialize's args."""

    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().shape[0]

            def text(value):
                return np.array([[value.encode()]] * rows, dtype=np.object_)

            outputs = [
                pb_utils.Tensor("REQUEST_ID", text(request.request_id())),
                pb_utils.Tensor("PARAMETERS", text(request.parameters())),
                pb_utils.Tensor("OUTPUTS", text(",".join(request.requested_output_names()))),
                pb_utils.Tensor("BATCH", np.full((rows, 1), len(requests), dtype=np.int32)),
                pb_utils.Tensor("ARGS", text(json.dumps(self.args))),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''

RUNNING_SUM_CONFIG = """
name: "running_sum"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_INT64 dims: [ 1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_INT64 dims: [ 1 ] } ]
}
"""

RUNNING_SUM_MODEL = '''
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A stateful model: TOTAL is the running sum of the sequence's X, kept as the implicit
    state SUM_IN -> SUM_OUT; START zeroes it. It also checks the sequence's id (CORRID)
    against the request's correlation_id()."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "SUM_IN").as_numpy()
            if int(corrid.reshape(-1)[0]) != request.correlation_id():
                raise pb_utils.TritonModelException("CORRID is not the sequence's id")
            total = (state * (1 - start) + x).astype(np.int64)
            outputs = [pb_utils.Tensor("TOTAL", total), pb_utils.Tensor("SUM_OUT", total)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''

REPEAT_CONFIG = """
name: "repeat"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_INT32 dims: [ 1 ] }
]
model_transaction_policy { decoupled: true }
dynamic_batching { max_queue_delay_microseconds: 100000 }
"""

REPEAT_MODEL = '''
import json
import os
import threading

import numpy as np

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    """A decoupled model: one response per element of IN (OUT = the element, IDX = its
    position), then the request is closed: by the final flag alone (an empty final
    response), or, with the parameter "last_is_final", on its last response. An element
    -1 answers that position with an error; -2 raises from execute; -3 ends the process.
    The parameter "later" sends the responses from a thread after execute returned."""

    def execute(self, requests):
        later = []
        for request in requests:
            params = json.loads(request.parameters())
            if params.get("later"):
                later.append(request)
            else:
                self.answer(request, params)
        if later:
            threading.Thread(target=self.answer_all, args=(later,)).start()
        return None

    def answer_all(self, requests):
        for request in requests:
            self.answer(request, json.loads(request.parameters()))

    def answer(self, request, params):
        sender = request.get_response_sender()
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
        last_is_final = bool(params.get("last_is_final")) and len(values) > 0
        for i, value in enumerate(values.tolist()):
            flags = FINAL if last_is_final and i == len(values) - 1 else 0
            if value == -2:
                raise pb_utils.TritonModelException("asked to fail at element %d" % i)
            if value == -3:
                os._exit(3)
            if value == -1:
                code = pb_utils.TritonError.INVALID_ARG
                error = pb_utils.TritonError("element %d is -1" % i, code)
                sender.send(pb_utils.InferenceResponse(error=error), flags=flags)
                continue
            out = pb_utils.Tensor("OUT", np.array([[value]], np.int32))
            idx = pb_utils.Tensor("IDX", np.array([[i]], np.int32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out, idx]), flags=flags)
        if not last_is_final:
            sender.send(flags=FINAL)
'''

ASYNC_REPEAT_CONFIG = REPEAT_CONFIG.replace('name: "repeat"', 'name: "async_repeat"')

ASYNC_REPEAT_MODEL = '''
import asyncio

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """repeat as an async def execute whose responses come from a task it leaves running
    (the request is closed after execute returned)."""

    async def execute(self, requests):
        self.tasks = [asyncio.get_running_loop().create_task(self.answer(r)) for r in requests]
        return None

    async def answer(self, request):
        sender = request.get_response_sender()
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
        for i, value in enumerate(values.tolist()):
            await asyncio.sleep(0)
            out = pb_utils.Tensor("OUT", np.array([[value]], np.int32))
            idx = pb_utils.Tensor("IDX", np.array([[i]], np.int32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out, idx]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

BLS_STREAM_CONFIG = """
name: "bls_stream"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "RESPONSES" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "EMPTY" data_type: TYPE_INT32 dims: [ 1 ] }
]
"""

BLS_STREAM_MODEL = '''
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Calls the decoupled model repeat with its IN through exec(decoupled=True): SUM of
    the OUTs it streamed back, how many RESPONSES carried data, how many were EMPTY."""

    def execute(self, requests):
        return [self.answer(request) for request in requests]

    def answer(self, request):
        call = pb_utils.InferenceRequest(
            model_name="repeat",
            inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
            requested_output_names=["OUT"],
        )
        return summed(call.exec(decoupled=True))


def summed(responses):
    total = count = empty = 0
    for response in responses:
        if response.has_error():
            raise pb_utils.TritonModelException(response.error().message())
        if not response.output_tensors():
            empty += 1
            continue
        total += int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0, 0])
        count += 1
    outs = [("SUM", total), ("RESPONSES", count), ("EMPTY", empty)]
    tensors = [pb_utils.Tensor(n, np.array([[v]], np.int32)) for n, v in outs]
    return pb_utils.InferenceResponse(output_tensors=tensors)
'''

ASYNC_BLS_STREAM_CONFIG = BLS_STREAM_CONFIG.replace(
    'name: "bls_stream"', 'name: "async_bls_stream"'
)

ASYNC_BLS_STREAM_MODEL = BLS_STREAM_MODEL.replace(
    """    def execute(self, requests):
        return [self.answer(request) for request in requests]

    def answer(self, request):""",
    """    async def execute(self, requests):
        return [await self.answer(request) for request in requests]

    async def answer(self, request):""",
).replace(
    "return summed(call.exec(decoupled=True))",
    "return summed(await call.async_exec(decoupled=True))",
)

ENDLESS_CONFIG = """
name: "endless"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""

ENDLESS_MODEL = '''
import os
import time

import numpy as np

import triton_python_backend_utils as pb_utils

LIMIT = 500


class TritonPythonModel:
    """Sends a response every 10 ms (OUT = how many so far) until its request is cancelled
    (at most LIMIT), then closes it; a cancelled request's count goes to the file
    cancelled-<request id> in the model's folder."""

    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sent = 0
            while sent < LIMIT and not request.is_cancelled():
                out = pb_utils.Tensor("OUT", np.array([[sent]], np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
                sent += 1
                time.sleep(0.01)
            if sender.is_cancelled():
                path = os.path.join(self.folder, "cancelled-" + request.request_id())
                with open(path, "w") as f:
                    f.write(str(sent))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


PATIENT_CONFIG = """
name: "patient"
backend: "python"
max_batch_size: 2
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 5000000 }
"""

PATIENT_MODEL = '''
import os
import time

import numpy as np

import triton_python_backend_utils as pb_utils

WAIT = -1
WAIT_S = 20.0


class TritonPythonModel:
    """Not decoupled. Echoes IN as OUT; a request whose IN is -1 waits until it is
    cancelled (at most WAIT_S), then answers a CANCELLED error, or the error "never
    cancelled". A waiting request's batch size goes to the file waiting-<request id> in the
    model's folder when it starts to wait, and the seconds it waited to cancelled-<request
    id> once it saw the cancel."""

    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        values = [int(r.inputs()[0].as_numpy()[0, 0]) for r in requests]
        waiting = [r for r, v in zip(requests, values) if v == WAIT]
        for request in waiting:
            self.mark("waiting-", request, len(requests))
        t0 = time.monotonic()
        while waiting and time.monotonic() - t0 < WAIT_S:
            if all(r.is_cancelled() for r in waiting):
                break
            time.sleep(0.01)
        responses = []
        for request, value in zip(requests, values):
            if value != WAIT:
                out = pb_utils.Tensor("OUT", np.array([[value]], np.int32))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            elif request.is_cancelled():
                self.mark("cancelled-", request, time.monotonic() - t0)
                error = pb_utils.TritonError("patient: stopped", pb_utils.TritonError.CANCELLED)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                error = pb_utils.TritonError("patient: never cancelled")
                responses.append(pb_utils.InferenceResponse(error=error))
        return responses

    def mark(self, prefix, request, value):
        path = os.path.join(self.folder, prefix + request.request_id())
        with open(path + ".tmp", "w") as f:
            f.write(str(value))
        os.replace(path + ".tmp", path)
'''


ANNOTATED_CONFIG = """
name: "annotated"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100000 }
"""

ANNOTATED_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Echoes INPUT0 as OUTPUT0, with the response parameters {"a": 1, "b": "x", "c": True};
    an INPUT0 of -1 adds a float one, which InferenceResponse refuses (its execute raises)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            params = {"a": 1, "b": "x", "c": True}
            if (x == -1).any():
                params["bad"] = 0.5
            out = pb_utils.Tensor("OUTPUT0", x)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out], parameters=params))
        return responses
'''

ANNOTATED_STREAM_CONFIG = """
name: "annotated_stream"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""

ANNOTATED_STREAM_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    """A decoupled model: one response per element of IN (OUT = the element), each with its
    own parameters {"index": i, "word": "w<element>", "even": i % 2 == 0}; then the final
    flag alone, or, with the request parameter "last_is_final", on the last response."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
            last_is_final = json.loads(request.parameters()).get("last_is_final", False)
            for i, value in enumerate(values.tolist()):
                params = {"index": i, "word": "w%d" % value, "even": i % 2 == 0}
                out = pb_utils.Tensor("OUT", np.array([[value]], np.int32))
                response = pb_utils.InferenceResponse(output_tensors=[out], parameters=params)
                last = last_is_final and i == len(values) - 1
                sender.send(response, flags=FINAL if last else 0)
            if not (last_is_final and len(values)):
                sender.send(flags=FINAL)
        return None
'''


LOADER_CONFIG = ADD_SUB_CONFIG.replace('name: "add_sub"', 'name: "loader"').replace(
    '{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }\n]',
    '{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] },\n'
    '  { name: "READY" data_type: TYPE_BOOL dims: [ 3 ] }\n]',
)
"""add_sub's tensors, and READY: the three readiness checks of the model loader's call."""

LOADER_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils

MODEL = "add_sub"
INPUTS, OUTPUTS = ("INPUT0", "INPUT1"), ("OUTPUT0", "OUTPUT1")


class TritonPythonModel:
    """Triton's model loading API from execute: for each request, is_model_ready(MODEL),
    load_model(MODEL), is_model_ready again, a BLS call of MODEL with INPUT0 and INPUT1, then
    unload_model(MODEL) (not when the request parameter "unload" is false) and is_model_ready
    once more. OUTPUT0 and OUTPUT1 are MODEL's answer, READY the three readiness answers."""

    def execute(self, requests):
        responses = []
        for request in requests:
            unload = json.loads(request.parameters()).get("unload", True)
            ready = [pb_utils.is_model_ready(MODEL)]
            pb_utils.load_model(MODEL)
            ready.append(pb_utils.is_model_ready(MODEL))
            answer = pb_utils.InferenceRequest(
                model_name=MODEL,
                requested_output_names=list(OUTPUTS),
                inputs=[pb_utils.get_input_tensor_by_name(request, n) for n in INPUTS],
            ).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            if unload:
                pb_utils.unload_model(MODEL)
            ready.append(pb_utils.is_model_ready(MODEL))
            outputs = [pb_utils.get_output_tensor_by_name(answer, n) for n in OUTPUTS]
            outputs.append(pb_utils.Tensor("READY", np.array([ready], dtype=bool)))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''

REFUSALS_CONFIG = """
name: "refusals"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "ERRORS" data_type: TYPE_STRING dims: [ 3 ] } ]
"""

REFUSALS_MODEL = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def error_of(call):
    try:
        call()
    except pb_utils.TritonModelException as exc:
        return exc.message()
    return "no error"


class TritonPythonModel:
    """What the model loading API answers where it refuses (run it in mode none): ERRORS
    holds the error of a load_model in initialize, of a load_model with files and of an
    unload_model in execute; finalize writes its load_model's error to finalize.txt in the
    model's folder."""

    def initialize(self, args):
        self.folder = args["model_repository"]
        self.errors = [error_of(lambda: pb_utils.load_model("add_sub"))]

    def execute(self, requests):
        errors = self.errors + [
            error_of(lambda: pb_utils.load_model("add_sub", files={"file:1/model.py": b""})),
            error_of(lambda: pb_utils.unload_model("add_sub")),
        ]
        out = pb_utils.Tensor("ERRORS", np.array([e.encode() for e in errors], dtype=object))
        return [pb_utils.InferenceResponse(output_tensors=[out]) for _ in requests]

    def finalize(self):
        with open(os.path.join(self.folder, "finalize.txt"), "w") as f:
            f.write(error_of(lambda: pb_utils.load_model("add_sub")))
'''

FORKING_CONFIG = """
name: "forking"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

HASTY_FORKING_CONFIG = (
    FORKING_CONFIG.replace('name: "forking"', 'name: "hasty_forking"')
    + """
parameters [ { key: "execute_timeout_s" value: { string_value: "2" } } ]
"""
)

STUBBORN_FORKING_CONFIG = (
    FORKING_CONFIG.replace('name: "forking"', 'name: "stubborn_forking"')
    + """
parameters [ { key: "helper_ignores_sigterm" value: { string_value: "yes" } } ]
"""
)

FORKING_MODEL = '''
import json
import os
import signal
import time

import triton_python_backend_utils as pb_utils

EXIT = -2.0
HANG = -4.0


class TritonPythonModel:
    """Forks a helper that sleeps 600 s (its pid appended to <model folder>/helpers; it
    ignores SIGTERM with the parameter helper_ignores_sigterm); echoes INPUT0, -2 ends the
    process at once, -4 never returns."""

    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        stubborn = "helper_ignores_sigterm" in parameters
        pid = os.fork()
        if pid == 0:
            if stubborn:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(600)
            os._exit(0)
        with open(os.path.join(args["model_repository"], "helpers"), "a") as pids:
            pids.write(f"{pid}\\n")

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if value[0] == EXIT:
                os._exit(3)
            if value[0] == HANG:
                time.sleep(3600)
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", value)])
            )
        return responses
'''


MODELS = {
    "add_sub": (ADD_SUB_CONFIG, ADD_SUB_MODEL),
    "bls": (BLS_CONFIG, BLS_MODEL),
    "async_bls": (ASYNC_BLS_CONFIG, ASYNC_BLS_MODEL),
    "metered": (METERED_CONFIG, METERED_MODEL),
    "faulty": (FAULTY_CONFIG, FAULTY_MODEL),
    "meta": (META_CONFIG, META_MODEL),
    "running_sum": (RUNNING_SUM_CONFIG, RUNNING_SUM_MODEL),
    "repeat": (REPEAT_CONFIG, REPEAT_MODEL),
    "async_repeat": (ASYNC_REPEAT_CONFIG, ASYNC_REPEAT_MODEL),
    "bls_stream": (BLS_STREAM_CONFIG, BLS_STREAM_MODEL),
    "async_bls_stream": (ASYNC_BLS_STREAM_CONFIG, ASYNC_BLS_STREAM_MODEL),
    "endless": (ENDLESS_CONFIG, ENDLESS_MODEL),
    "patient": (PATIENT_CONFIG, PATIENT_MODEL),
    "annotated": (ANNOTATED_CONFIG, ANNOTATED_MODEL),
    "annotated_stream": (ANNOTATED_STREAM_CONFIG, ANNOTATED_STREAM_MODEL),
    "loader": (LOADER_CONFIG, LOADER_MODEL),
    "refusals": (REFUSALS_CONFIG, REFUSALS_MODEL),
    "forking": (FORKING_CONFIG, FORKING_MODEL),
    "hasty_forking": (HASTY_FORKING_CONFIG, FORKING_MODEL),
    "stubborn_forking": (STUBBORN_FORKING_CONFIG, FORKING_MODEL),
}


def write_model(root: Path, name: str, config: str, source: str, version: int = 1) -> Path:
    """``root/name/config.pbtxt`` and ``root/name/<version>/model.py``."""
    folder = root / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config.lstrip())
    (folder / str(version) / "model.py").write_text(source.lstrip())
    return root


def write_repository(root: Path, *names: str) -> Path:
    """A repository under ``root`` with the named test models (every one by default)."""
    for name in names or tuple(MODELS):
        config, source = MODELS[name]
        write_model(root, name, config, source)
    return root
