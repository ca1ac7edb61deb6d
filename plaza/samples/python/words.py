"""words (Triton Python backend, decoupled): one response per word of a text, as it goes.

TEXT (BYTES [1], UTF-8) -> for each whitespace-separated word, in order, a response of
WORD (BYTES [1]) and INDEX (INT32 [1], its position in its text from 0). A request of
several rows (TEXT [n, 1]: max_batch_size lets a client batch texts) gets the words of
each row in turn, each response a row of its own ([1, 1]); the request's last response
closes it (TRITONSERVER_RESPONSE_COMPLETE_FINAL), and a request without words closes it
with no response at all. What a token-streaming model does, without a model: its
responses reach a gRPC stream or generate_stream one by one.
"""

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found, unused-ignore]

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _words(texts: Any) -> list[tuple[int, str]]:
    """(position in its text, word) for every word of every row, rows in order."""
    found: list[tuple[int, str]] = []
    for text in texts.reshape(-1):
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        found.extend(enumerate(str(text).split()))
    return found


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            words = _words(pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy())
            if not words:
                sender.send(flags=FINAL)
                continue
            for n, (i, word) in enumerate(words):
                outputs = [
                    pb_utils.Tensor("WORD", np.array([[word.encode()]], dtype=np.object_)),
                    pb_utils.Tensor("INDEX", np.array([[i]], dtype=np.int32)),
                ]
                flags = FINAL if n == len(words) - 1 else 0
                sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=flags)
        return None
