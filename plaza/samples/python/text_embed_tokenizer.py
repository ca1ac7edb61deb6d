"""text_embed's first step (Triton Python backend): sentences in, token ids and mask out.

TEXT (TYPE_STRING [1]: one UTF-8 sentence per row) -> input_ids, attention_mask (INT64
[-1]): BERT uncased WordPiece from the tokenizer.json next to this file, ``[CLS] ... [SEP]``,
truncated to ``max_length`` tokens (the final [SEP] kept), padded with id 0 / mask 0 to the
request's longest sentence rounded up to a multiple of ``pad_multiple``, so that requests of
similar lengths share a shape and the encoder's worker can batch them. Padding does not
change the embedding. Both are config parameters (defaults 256 and 16).
"""

import json
import os
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found, unused-ignore]
from tokenizers import Tokenizer


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.max_length = int(parameters.get("max_length", "256"))
        self.pad_multiple = int(parameters.get("pad_multiple", "16"))
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        ids_config = pb_utils.get_output_config_by_name(config, "input_ids")
        self.dtype = pb_utils.triton_string_to_numpy(ids_config["data_type"])

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            try:
                sentences = [_decode(item) for item in text.reshape(-1)]
            except UnicodeDecodeError as exc:
                error = pb_utils.TritonError(
                    f"TEXT must be UTF-8: {exc}", pb_utils.TritonError.INVALID_ARG
                )
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            ids, mask = self.encode(sentences)
            outputs = [pb_utils.Tensor("input_ids", ids), pb_utils.Tensor("attention_mask", mask)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses

    def encode(self, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The ids and mask of one request, [rows, width]."""
        limit = self.max_length
        encoded = [e.ids for e in self.tokenizer.encode_batch(sentences)] if sentences else []
        encoded = [ids if len(ids) <= limit else [*ids[: limit - 1], ids[-1]] for ids in encoded]
        longest = max((len(ids) for ids in encoded), default=0)
        width = min(-(-longest // self.pad_multiple) * self.pad_multiple, limit)
        ids = np.zeros((len(encoded), width), dtype=self.dtype)
        mask = np.zeros((len(encoded), width), dtype=self.dtype)
        for row, tokens in enumerate(encoded):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        return ids, mask


def _decode(item: Any) -> str:
    return item.decode("utf-8") if isinstance(item, bytes) else str(item)
