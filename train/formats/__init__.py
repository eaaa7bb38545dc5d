"""LiteRT and ONNX files beside the SavedModel, each checked in a fresh process without TensorFlow.

Optional and deletable: remove this folder and its line in train/extras.py; exports are then the
SavedModel, the .keras file and the labels. ONNX's converter comes from requirements/onnx.lock
(`scripts/venv.sh --extra onnx`); the runtimes that check the files, from requirements/runtime-check.lock.

settings.py       EXPORT_FORMATS, EXPORT_QUANTIZE, EXPORT_CHECK_PYTHON
convert.py        what the export calls: converts each format into its staging folder and checks it
litert.py         the SavedModel to model.tflite (float or quantised), with TensorFlow's own converter
onnx_export.py    the serving function to model.onnx, with tf2onnx
runtime_check.py  runs a .tflite / .onnx with numpy and its runtime only, in a fresh process
"""

from ..errors import ExportError


class ConversionError(ExportError):
    """A converter (LiteRT, ONNX) cannot express the model: names the format, the op or layer, and the fix."""

    def __init__(self, fmt: str, what: str, fix: str):
        super().__init__(f"{fmt}: {what}: {fix}")
