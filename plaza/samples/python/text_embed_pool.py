"""text_embed's last step (Triton Python backend): mean pooling and L2 normalisation.

token_embeddings (FP32 [-1, 384], the encoder's last hidden state) and attention_mask (INT64
[-1]) -> embedding (FP32 [384], unit length), as sentence-transformers' Pooling(mean) and
Normalize compute it: the mean over the positions whose mask is 1 (the count clamped at
1e-9), divided by its L2 norm (clamped at 1e-12). A row whose mask is all zeros gives zeros.
"""

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found, unused-ignore]


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "token_embeddings").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()
            if tokens.shape[:2] != mask.shape:
                message = (
                    f"token_embeddings {list(tokens.shape)} and attention_mask "
                    f"{list(mask.shape)} must have the same rows and positions"
                )
                error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            output = pb_utils.Tensor("embedding", mean_pool_normalize(tokens, mask))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses


def mean_pool_normalize(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask.astype(np.float32)[..., None]
    summed = (tokens.astype(np.float32) * weights).sum(axis=1)
    mean = summed / np.maximum(weights.sum(axis=1), np.float32(1e-9))
    norm = np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), np.float32(1e-12))
    return np.asarray(mean / norm, dtype=np.float32)
