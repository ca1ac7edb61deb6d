"""words (Triton Python backend, decoupled): one response per word of a text, as it goes.

TEXT (BYTES [1], UTF-8) -> for each whitespace-separated word, in order, a response of
WORD (BYTES [1]) and INDEX (INT32 [1], its position from 0); the last word's response
closes the request (TRITONSERVER_RESPONSE_COMPLETE_FINAL), and a text without words closes
it with no response at all. What a token-streaming model does, without a model: its
responses reach a gRPC stream or generate_stream one by one.
"""

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found, unused-ignore]

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)[0]
            if isinstance(text, bytes):
                text = text.decode("utf-8", "replace")
            words = str(text).split()
            if not words:
                sender.send(flags=FINAL)
                continue
            for i, word in enumerate(words):
                outputs = [
                    pb_utils.Tensor("WORD", np.array([[word.encode()]], dtype=np.object_)),
                    pb_utils.Tensor("INDEX", np.array([[i]], dtype=np.int32)),
                ]
                flags = FINAL if i == len(words) - 1 else 0
                sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=flags)
        return None
