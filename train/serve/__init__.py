"""`python -m train serve`: the exported model behind TensorFlow Serving's REST API, the Open
Inference Protocol (KServe v2) and a plain file-upload /predict, with dynamic batching.

Optional and deletable: remove this folder and its line in train/extras.py. Its
packages (Starlette, uvicorn) come from requirements/serve.lock, installed only by the `serve` image.
"""
