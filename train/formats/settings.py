"""The formats extra's settings: which files beside the SavedModel, quantised or not, checked by which Python."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..sections import setting

FORMATS = ("savedmodel", "litert", "onnx")
QUANTIZE_MODES = ("none", "dynamic", "int8")


@dataclass(frozen=True)
class Section:
    """export formats beyond the SavedModel (docs/export.md)"""

    export_formats: str = setting(
        "savedmodel",
        "formats to export, comma-separated: savedmodel (always written: the others are made from it and "
        "checked against it) | litert (export/model.tflite) | onnx (export/model.onnx)",
        kind="surroundings",
    )
    export_quantize: str = setting(
        "none",
        "also write a post-training quantised LiteRT file: dynamic (int8 weights) | int8 (weights and "
        "activations, calibrated on training images) | none; implies litert in EXPORT_FORMATS",
        choices=QUANTIZE_MODES,
        kind="surroundings",
    )
    export_check_python: str = setting(
        "",
        "Python that runs the LiteRT/ONNX parity check, which needs their runtimes; empty: "
        ".venv-runtime-check/bin/python when scripts/venv-runtime-check.sh made it (scripts/venv.sh --extra onnx "
        "does), else this Python",
        kind="surroundings",
    )


def wanted(value: str, quantize: str = "none") -> tuple[str, ...]:
    """EXPORT_FORMATS as a tuple, savedmodel first (the reference the others are checked against);
    with EXPORT_QUANTIZE, litert too (the float file is the quantised one's reference)."""
    names = [n.strip().lower() for n in value.split(",") if n.strip()]
    for name in names:
        if name not in FORMATS:
            raise ConfigError(
                "EXPORT_FORMATS", value, f"{name!r} is not a format: a comma list of " + ", ".join(FORMATS)
            )
    if quantize != "none":
        names.append("litert")
    return ("savedmodel", *(f for f in FORMATS[1:] if f in names))


def check(settings) -> None:
    wanted(settings.export_formats)


def flags(command: str) -> dict[str, tuple[str, str]]:
    """The flags this extra adds to a core command: flag -> (the setting it sets, its help)."""
    if command != "export":
        return {}
    return {
        "--format": (
            "export_formats",
            "formats, comma-separated: savedmodel (always), litert, onnx (default: EXPORT_FORMATS)",
        ),
        "--quantize": (
            "export_quantize",
            "none | dynamic | int8: also a quantised LiteRT file (default: EXPORT_QUANTIZE, none)",
        ),
    }


def turned_on(settings) -> str:
    """ONNX's converter is this extra's package (LiteRT's is TensorFlow's own): asked for by EXPORT_FORMATS."""
    return "EXPORT_FORMATS" if "onnx" in wanted(settings.export_formats) else ""
