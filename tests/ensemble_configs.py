"""Model configs that several ensemble test files build their repositories from."""

from __future__ import annotations

# A simulated FP32 model of four elements a row: the step that fixed-shape ensemble tests
# route their [-1] inputs through.
FOUR = """
name: "four"
backend: "plaza_simulated"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
