"""Request bodies -> uint8 image batches, and the checks that answer 400 naming what is wrong.

Three shapes come in: TensorFlow Serving's JSON (`instances` or `inputs`, nested lists of pixels or
{"b64": PNG/JPEG}), the Open Inference Protocol's typed tensors (UINT8 pixels, or BYTES holding
image files; JSON or the binary-data extension tritonclient sends by default) and file uploads.
Image files are decoded as training decodes them (train.results.predict.decode_image_bytes), in
memory: nothing here opens a path.
"""

from __future__ import annotations

import base64
import binascii
import email.parser
import email.policy
import json
import struct
from typing import Any

import numpy as np

from ..errors import DataError, RequestError
from ..results.predict import decode_image_bytes

INPUT = "images"  # the serving signature's one input (train.results.export.write_savedmodel)


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError("body", None, f"not JSON ({exc}); send a JSON object") from None
    except RecursionError:
        raise RequestError(
            "body", None, "JSON nested too deeply; an image is nested only as deep as its shape"
        ) from None


def check_batch(images: np.ndarray, max_batch: int) -> np.ndarray:
    if len(images) == 0:
        raise RequestError("batch", 0, "no image in the request; send at least one")
    if len(images) > max_batch:
        raise RequestError("batch", len(images), f"more images than SERVE_MAX_BATCH={max_batch}; split the request")
    return images


def pixels(value: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
    """Nested lists of integers 0..255 -> uint8 (N, *shape); RequestError naming shape or type."""
    try:
        array = np.asarray(value)
    except ValueError:  # ragged lists
        raise RequestError(what, None, f"ragged nested lists; each image is {_shape(shape)}") from None
    if array.dtype.kind not in "iu" and not (array.dtype.kind == "f" and array.size == 0):
        kind = {"f": "floats", "U": "strings", "b": "booleans", "O": "mixed values"}.get(
            array.dtype.kind, "not integers"
        )
        raise RequestError(what, None, f"holds {kind}; the pixels are integers 0..255 (uint8)")
    if array.ndim != len(shape) + 1 or tuple(array.shape[1:]) != tuple(shape):
        raise RequestError(
            what, f"shape {list(array.shape)}", f"the images are {_shape(shape)} each: send shape [N, {_dims(shape)}]"
        )
    if array.size and (array.min() < 0 or array.max() > 255):
        raise RequestError(what, None, "pixels outside 0..255; the model takes uint8 pixels")
    return array.astype(np.uint8)


def image_file(raw: bytes, shape: tuple[int, ...], what: str) -> np.ndarray:
    try:
        return decode_image_bytes(raw, what, shape)
    except DataError as exc:
        raise RequestError(what, None, f"not an image the model reads ({str(exc).split(': ', 1)[-1]})") from None


def b64_image(value: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
    if not isinstance(value, str):
        raise RequestError(what, type(value).__name__, 'the "b64" value is a base64 string of a PNG or JPEG file')
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(what, None, 'the "b64" value is not base64; encode the image file with base64') from None
    return image_file(raw, shape, what)


# --- TensorFlow Serving REST API ---


def tf_serving_images(doc: Any, shape: tuple[int, ...]) -> tuple[np.ndarray, bool]:
    """(images, columnar) of a :predict body: `instances` (row form) or `inputs` (columnar)."""
    if not isinstance(doc, dict):
        raise RequestError("body", type(doc).__name__, 'send a JSON object with "instances" or "inputs"')
    if "instances" in doc and "inputs" in doc:
        raise RequestError("body", None, 'both "instances" and "inputs": send one of them')
    signature = doc.get("signature_name", "serving_default")
    if signature != "serving_default":
        raise RequestError("signature_name", signature, 'the export has one signature, "serving_default"')
    if "instances" in doc:
        rows = doc["instances"]
        if not isinstance(rows, list):
            raise RequestError("instances", type(rows).__name__, "a list of images, one per row")
        return _stack([_named(r, f"instances[{i}]", shape) for i, r in enumerate(rows)], shape), False
    if "inputs" not in doc:
        raise RequestError("body", ", ".join(map(str, doc)) or "{}", 'no "instances" or "inputs": send one of them')
    column = doc["inputs"]
    if isinstance(column, dict) and "b64" not in column:
        if set(column) != {INPUT}:
            raise RequestError("inputs", ", ".join(map(str, column)), f'the model has one input, "{INPUT}"')
        column = column[INPUT]
    if isinstance(column, dict):  # one {"b64": ...}: a batch of one image
        return _stack([_one(column, "inputs", shape)], shape), True
    if isinstance(column, list) and column and all(isinstance(c, dict) for c in column):
        return _stack([_one(c, f"inputs[{i}]", shape) for i, c in enumerate(column)], shape), True
    return pixels(column, shape, "inputs"), True


def _named(row: Any, what: str, shape) -> np.ndarray:
    if isinstance(row, dict) and "b64" not in row:
        if set(row) != {INPUT}:
            raise RequestError(what, ", ".join(map(str, row)), f'the model has one input, "{INPUT}"')
        row = row[INPUT]
    return _one(row, what, shape)


def _one(value: Any, what: str, shape) -> np.ndarray:
    if isinstance(value, dict):
        if set(value) != {"b64"}:
            raise RequestError(what, ", ".join(map(str, value)), 'an image is nested pixel lists or {"b64": "..."}')
        return b64_image(value["b64"], shape, what)
    return pixels([value], shape, what)[0]


def _stack(images: list[np.ndarray], shape) -> np.ndarray:
    return np.stack(images) if images else np.zeros((0, *shape), np.uint8)


def _shape(shape) -> str:
    return "x".join(map(str, shape)) + " uint8"


def _dims(shape) -> str:
    return ", ".join(map(str, shape))


# --- Open Inference Protocol (KServe v2) ---


def v2_request(body: bytes, header_length: str | None, shape: tuple[int, ...], output: str) -> tuple[np.ndarray, dict]:
    """(images, {"id", "binary"}) of an infer request, JSON or with the binary-data extension."""
    raw = b""
    if header_length is not None:
        try:
            n = int(header_length)
            if not 0 <= n <= len(body):
                raise ValueError
        except ValueError:
            raise RequestError(
                "Inference-Header-Content-Length", header_length, f"must be the JSON part's length, 0..{len(body)}"
            ) from None
        body, raw = body[:n], body[n:]
    doc = parse_json(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise RequestError("body", None, 'an inference request is a JSON object with an "inputs" list')
    if len(doc["inputs"]) != 1 or not isinstance(doc["inputs"][0], dict):
        raise RequestError("inputs", len(doc["inputs"]), f'send exactly one input tensor, "{INPUT}"')
    tensor = doc["inputs"][0]
    if tensor.get("name") != INPUT:
        raise RequestError("inputs[0].name", tensor.get("name"), f'the model\'s input is "{INPUT}"')
    images = _v2_tensor(tensor, raw, shape)
    binary = bool(_params(doc, "parameters").get("binary_data_output", False))
    outputs = doc.get("outputs") or []
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise RequestError("outputs", None, f'a list of objects such as {{"name": "{output}"}}')
    for out in outputs:
        if out.get("name") != output:
            raise RequestError("outputs", out.get("name"), f'the model\'s output is "{output}"')
        binary = bool(_params(out, "outputs").get("binary_data", binary))
    return images, {"id": doc.get("id"), "binary": binary}


def _params(doc: dict, what: str) -> dict:
    params = doc.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise RequestError(f"{what} parameters", type(params).__name__, "an object of name: value")
    return params


def _v2_tensor(tensor: dict, raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
    dims, dtype, params = tensor.get("shape"), tensor.get("datatype"), _params(tensor, "inputs[0]")
    if not isinstance(dims, list) or not all(isinstance(d, int) and d >= 0 for d in dims):
        raise RequestError("inputs[0].shape", dims, "a list of non-negative integers")
    size = params.get("binary_data_size")
    if size is not None and (not isinstance(size, int) or size != len(raw)):
        raise RequestError("binary_data_size", size, f"the binary part after the JSON holds {len(raw)} bytes")
    if dtype == "UINT8":
        if tuple(dims[1:]) != tuple(shape) or len(dims) != len(shape) + 1:
            raise RequestError("inputs[0].shape", dims, f"UINT8 images are [N, {_dims(shape)}]")
        if size is not None:
            if len(raw) != int(np.prod(dims)):
                raise RequestError("binary_data_size", size, f"shape {dims} of UINT8 needs {int(np.prod(dims))} bytes")
            return np.frombuffer(raw, np.uint8).reshape(dims)
        flat = pixels_flat(tensor.get("data"), int(np.prod(dims)))
        return flat.reshape(dims)
    if dtype == "BYTES":
        if len(dims) not in (1, 2) or len(dims) == 2 and dims[1] != 1:
            raise RequestError("inputs[0].shape", dims, "BYTES inputs are image files, shape [N] or [N, 1]")
        files = _length_prefixed(raw) if size is not None else _b64_list(tensor.get("data"))
        if len(files) != dims[0]:
            raise RequestError("inputs[0].shape", dims, f"the data holds {len(files)} elements")
        return _stack([image_file(f, shape, f"inputs[0][{i}]") for i, f in enumerate(files)], shape)
    raise RequestError("inputs[0].datatype", dtype, "UINT8 (pixels) or BYTES (PNG/JPEG files)")


def pixels_flat(data: Any, count: int) -> np.ndarray:
    try:
        array = np.asarray(data).reshape(-1) if data is not None else np.zeros(0)
    except ValueError:
        raise RequestError("inputs[0].data", None, "ragged nested lists") from None
    if array.size != count:
        raise RequestError("inputs[0].data", f"{array.size} values", f"the shape given needs {count}")
    if array.size and (array.dtype.kind not in "iu" or array.min() < 0 or array.max() > 255):
        raise RequestError("inputs[0].data", None, "UINT8 data are integers 0..255")
    return array.astype(np.uint8)


def _length_prefixed(raw: bytes) -> list[bytes]:
    """BYTES in the binary extension: each element a 4-byte little-endian length, then its bytes."""
    out, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise RequestError("binary data", None, "a BYTES element is cut short (4-byte length, then the bytes)")
        (n,) = struct.unpack_from("<I", raw, at)
        if at + 4 + n > len(raw):
            raise RequestError("binary data", n, "a BYTES element longer than the data sent")
        out.append(raw[at + 4 : at + 4 + n])
        at += 4 + n
    return out


def _b64_list(data: Any) -> list[bytes]:
    if not isinstance(data, list) or not all(isinstance(d, str) for d in data):
        raise RequestError("inputs[0].data", None, "BYTES data in JSON are base64 strings of image files")
    try:
        return [base64.b64decode(d, validate=True) for d in data]
    except (binascii.Error, ValueError):
        raise RequestError("inputs[0].data", None, "not base64; encode each image file with base64") from None


def v2_response(model, probs: np.ndarray, meta: dict) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of an infer answer: FP32 probabilities, as JSON or binary as asked."""
    out = {"name": model.output_name, "datatype": "FP32", "shape": list(probs.shape)}
    doc: dict[str, Any] = {"model_name": model.name, "model_version": "1", "outputs": [out]}
    if meta.get("id") is not None:
        doc["id"] = meta["id"]
    if not meta["binary"]:
        out["data"] = probs.astype(np.float32).reshape(-1).tolist()
        return json.dumps(doc).encode(), {"content-type": "application/json"}
    raw = probs.astype("<f4").tobytes()
    out["parameters"] = {"binary_data_size": len(raw)}
    head = json.dumps(doc).encode()
    return head + raw, {"content-type": "application/octet-stream", "inference-header-content-length": str(len(head))}


# --- plain uploads ---


def uploads(body: bytes, content_type: str, shape: tuple[int, ...]) -> tuple[list[str], np.ndarray]:
    """(file names, images) of a multipart/form-data upload, or of a body that is one image file."""
    if not content_type.lower().startswith("multipart/form-data"):
        return ["body"], image_file(body, shape, "body")[None]
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1", "replace")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise RequestError("body", None, "a multipart/form-data upload without parts; send curl -F file=@image.png")
    names, images = [], []
    for part in message.iter_parts():
        name = part.get_filename()
        if name is None:
            continue  # an ordinary form field
        shown = "".join(ch if ch.isprintable() else "?" for ch in name)[:200]
        images.append(image_file(part.get_payload(decode=True) or b"", shape, shown or "file"))
        names.append(shown)
    if not images:
        raise RequestError("body", None, "no file in the upload; send one as curl -F file=@image.png")
    return names, np.stack(images)
