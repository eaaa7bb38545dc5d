"""Request bodies -> uint8 image batches, and the checks that answer 400 naming what is wrong.

Three shapes come in: TensorFlow Serving's JSON (`instances` or `inputs`, nested lists of pixels or
{"b64": PNG/JPEG}), the Open Inference Protocol's typed tensors (UINT8 pixels, or BYTES holding
image files; JSON or the binary-data extension tritonclient sends by default) and file uploads.
Each reader returns the request's images as `Pending`: parsed and counted, image files still
encoded, with the pixels their headers declare, so that what decoding will cost is known before it
starts (train.serve.work decides where and whether it runs). Image files are decoded as training
decodes them (train.inputs.images.decode_image_bytes), in memory: nothing here opens a path.
"""

from __future__ import annotations

import base64
import binascii
import email.message
import email.parser
import email.policy
import json
import math
import struct
from typing import Any

import numpy as np

from ..errors import DataError, TemplateError
from ..inputs.images import SUPPORTED, declared_pixels, decode_image_bytes

INPUT = "images"  # the serving signature's one input (train.results.export.write_savedmodel)


class RequestError(TemplateError, exit_code=2):
    """`serve`: a request the server refuses, answered with its HTTP status and {"error": message}.

    The server answers it and lives on (exit_code is never a process's). `name` is what in the request is wrong
    (a field, a header, a tensor), `value` what it held, `fix` what to send instead.
    """

    def __init__(self, name: str, value: object, fix: str, status: int = 400, retry_after: int | None = None):
        self.name, self.value, self.fix, self.status = name, value, fix, status
        self.retry_after = retry_after  # seconds, sent as Retry-After: a refusal that passes with time (503)
        shown = "" if value is None else f" ({str(value)[:80]})"
        super().__init__(f"{name}{shown}: {fix}")


def parse_json(body: bytes, shape: tuple[int, ...], max_batch: int) -> Any:
    """The JSON body of a request, refused before it is parsed when it has more values than SERVE_MAX_BATCH
    images of `shape` hold. Counted by its commas, which costs no parse: a pixel takes a comma, a base64
    image none. Parsed, 16 MB of small nested lists were about 500 MB of Python objects."""
    most = max_batch * math.prod(shape) + 1000  # the rest: the commas of a request's keys and objects
    if body.count(b",") > most:
        raise RequestError(
            "body",
            f"over {most:,} values",
            f"more than SERVE_MAX_BATCH={max_batch} images of {'x'.join(map(str, shape))} hold; split the request",
        )
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError("body", None, f"not JSON ({exc}); send a JSON object") from None
    except RecursionError:
        raise RequestError(
            "body", None, "JSON nested too deeply; an image is nested only as deep as its shape"
        ) from None


def check_count(count: int, max_batch: int, what: str = "batch") -> int:
    """Refuse a request of no image or of more than SERVE_MAX_BATCH: called with the count a request
    declares (its rows, shape[0], its parts) before any image is decoded, so an oversized request
    costs no more than reading it."""
    if count == 0:
        raise RequestError(what, 0, "no image in the request; send at least one")
    if count > max_batch:
        raise RequestError(what, count, f"more images than SERVE_MAX_BATCH={max_batch}; split the request")
    return count


def pixels(value: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
    """Nested lists of integers 0..255 -> uint8 (N, *shape); RequestError naming shape or type."""
    try:
        array = np.asarray(value)
    except ValueError:  # ragged lists
        raise RequestError(what, None, f"ragged nested lists; each image is {_shape(shape)}") from None
    if array.dtype.kind == "O" and all(isinstance(v, int) and not isinstance(v, bool) for v in array.flat):
        raise RequestError(what, None, "pixels outside 0..255; the model takes uint8 pixels")  # beyond int64
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


class Pending:
    """A request's images before decoding: pixel arrays as sent, and image files as (what, bytes),
    whose headers are read here: `pixels` is what decoding them will cost. A file whose header
    cannot be read is refused now, since what the decoder would make of it is unknown."""

    def __init__(self, parts: list, shape: tuple[int, ...]):
        self.parts, self.shape, self.pixels = parts, tuple(shape), 0
        for part in parts:
            if isinstance(part, tuple):
                what, raw = part
                pixels = declared_pixels(raw)
                if pixels is None:
                    raise RequestError(what, None, f"not an image the model reads (send {SUPPORTED})")
                self.pixels += pixels

    @classmethod
    def of(cls, images: np.ndarray) -> Pending:
        """Pixels sent as they are (N, *shape): nothing left to decode."""
        return cls(list(images), images.shape[1:])

    def decode(self) -> np.ndarray:
        images = [
            part if isinstance(part, np.ndarray) else image_file(part[1], self.shape, part[0]) for part in self.parts
        ]
        return np.stack(images) if images else np.zeros((0, *self.shape), np.uint8)


def image_file(raw: bytes, shape: tuple[int, ...], what: str) -> np.ndarray:
    try:
        # No limit of its own: SERVE_MAX_PIXELS has bounded what the request's headers declare (work.py),
        # and a raised one let an image over MAX_IMAGE_PIXELS's default through, to be refused here.
        return decode_image_bytes(raw, what, shape, None)
    except DataError as exc:
        raise RequestError(what, None, f"not an image the model reads ({str(exc).split(': ', 1)[-1]})") from None


def b64_image(value: Any, what: str) -> tuple[str, bytes]:
    if not isinstance(value, str):
        raise RequestError(what, type(value).__name__, 'the "b64" value is a base64 string of a PNG or JPEG file')
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(what, None, 'the "b64" value is not base64; encode the image file with base64') from None
    return what, raw


# --- TensorFlow Serving REST API ---


def tf_serving_images(doc: Any, shape: tuple[int, ...], max_batch: int) -> tuple[Pending, bool]:
    """(images, columnar) of a :predict body: `instances` (row form) or `inputs` (columnar); the
    rows are counted against `max_batch` before one is decoded."""
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
        check_count(len(rows), max_batch)
        return Pending([_named(r, f"instances[{i}]", shape) for i, r in enumerate(rows)], shape), False
    if "inputs" not in doc:
        raise RequestError("body", ", ".join(map(str, doc)) or "{}", 'no "instances" or "inputs": send one of them')
    column = doc["inputs"]
    if isinstance(column, dict) and "b64" not in column:
        if set(column) != {INPUT}:
            raise RequestError("inputs", ", ".join(map(str, column)) or "{}", f'the model has one input, "{INPUT}"')
        column = column[INPUT]
    if isinstance(column, dict):  # one {"b64": ...}: a batch of one image
        return Pending([_one(column, "inputs", shape)], shape), True
    if isinstance(column, list):
        check_count(len(column), max_batch)
    if isinstance(column, list) and column and all(isinstance(c, dict) for c in column):
        return Pending([_one(c, f"inputs[{i}]", shape) for i, c in enumerate(column)], shape), True
    return Pending.of(pixels(column, shape, "inputs")), True


def _named(row: Any, what: str, shape) -> np.ndarray | tuple[str, bytes]:
    if isinstance(row, dict) and "b64" not in row:
        if set(row) != {INPUT}:
            raise RequestError(what, ", ".join(map(str, row)) or "{}", f'the model has one input, "{INPUT}"')
        row = row[INPUT]
    return _one(row, what, shape)


def _one(value: Any, what: str, shape) -> np.ndarray | tuple[str, bytes]:
    """An image's pixels, or (what, bytes) of an image file to decode."""
    if isinstance(value, dict):
        if set(value) != {"b64"}:
            raise RequestError(what, ", ".join(map(str, value)), 'an image is nested pixel lists or {"b64": "..."}')
        return b64_image(value["b64"], what)
    return pixels([value], shape, what)[0]


def _shape(shape) -> str:
    return "x".join(map(str, shape)) + " uint8"


def _dims(shape) -> str:
    return ", ".join(map(str, shape))


# --- Open Inference Protocol (KServe v2) ---


def v2_request(
    body: bytes, header_length: str | None, shape: tuple[int, ...], output: str, max_batch: int
) -> tuple[Pending, dict]:
    """(images, {"id", "binary"}) of an infer request, JSON or with the binary-data extension; its
    shape[0] is counted against `max_batch` before any element is read."""
    raw = b""
    if header_length is not None:
        # Digits only, as Content-Length: int() would take "+5", " 5" and "5_0" too.
        if not (header_length.isascii() and header_length.isdigit() and int(header_length) <= len(body)):
            raise RequestError(
                "Inference-Header-Content-Length", header_length, f"must be the JSON part's length, 0..{len(body)}"
            )
        n = int(header_length)
        body, raw = body[:n], body[n:]
    doc = parse_json(body, shape, max_batch)
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise RequestError("body", None, 'an inference request is a JSON object with an "inputs" list')
    if len(doc["inputs"]) != 1 or not isinstance(doc["inputs"][0], dict):
        raise RequestError("inputs", len(doc["inputs"]), f'send exactly one input tensor, "{INPUT}"')
    if doc.get("id") is not None and not isinstance(doc["id"], str):  # echoed back, where a client reads a string
        raise RequestError("id", json.dumps(doc["id"]), "a string, or left out")
    tensor = doc["inputs"][0]
    if tensor.get("name") != INPUT:
        raise RequestError("inputs[0].name", tensor.get("name"), f'the model\'s input is "{INPUT}"')
    images = _v2_tensor(tensor, raw, shape, max_batch)
    binary = _flag(_params(doc, ""), "binary_data_output", False, "parameters")
    outputs = doc.get("outputs") or []
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise RequestError("outputs", None, f'a list of objects such as {{"name": "{output}"}}')
    for i, out in enumerate(outputs):
        if out.get("name") != output:
            raise RequestError("outputs", out.get("name"), f'the model\'s output is "{output}"')
        params = _params(out, f"outputs[{i}].")
        if "classification" in params:  # Triton's top-k labels as text: an answer this server does not give
            raise RequestError(
                f"outputs[{i}].parameters.classification",
                params["classification"],
                f'not supported here: ask for "{output}" and take the top classes from its probabilities',
            )
        binary = _flag(params, "binary_data", binary, f"outputs[{i}].parameters")
    return images, {"id": doc.get("id"), "binary": binary}


def _params(doc: dict, where: str) -> dict:
    """`doc`'s "parameters", named in an error by where it is: "" (the request's own), "inputs[0]." ..."""
    params = doc.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise RequestError(f"{where}parameters", type(params).__name__, "an object of name: value")
    return params


def _flag(params: dict, key: str, default: bool, where: str) -> bool:
    """A boolean parameter: a JSON true or false, never a truthy string ("false" would mean binary)."""
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise RequestError(f"{where}.{key}", value, "true or false (a JSON boolean)")
    return value


def _v2_tensor(tensor: dict, raw: bytes, shape: tuple[int, ...], max_batch: int) -> Pending:
    dims, dtype, params = _v2_shape(tensor.get("shape"), shape), tensor.get("datatype"), _params(tensor, "inputs[0].")
    check_count(dims[0], max_batch, "inputs[0].shape[0]")
    size = params.get("binary_data_size")
    if size is not None and (not isinstance(size, int) or size != len(raw)):
        raise RequestError("binary_data_size", size, f"the binary part after the JSON holds {len(raw)} bytes")
    if dtype == "UINT8":
        if tuple(dims[1:]) != tuple(shape) or len(dims) != len(shape) + 1:
            raise RequestError("inputs[0].shape", dims, f"UINT8 images are [N, {_dims(shape)}]")
        if size is not None:
            if len(raw) != math.prod(dims):
                raise RequestError("binary_data_size", size, f"shape {dims} of UINT8 needs {math.prod(dims)} bytes")
            return Pending.of(np.frombuffer(raw, np.uint8).reshape(dims))
        flat = pixels_flat(tensor.get("data"), math.prod(dims))
        return Pending.of(flat.reshape(dims))
    if dtype == "BYTES":
        if len(dims) not in (1, 2) or len(dims) == 2 and dims[1] != 1:
            raise RequestError("inputs[0].shape", dims, "BYTES inputs are image files, shape [N] or [N, 1]")
        files = _length_prefixed(raw, dims[0]) if size is not None else _b64_list(tensor.get("data"), dims[0])
        if len(files) != dims[0]:
            raise RequestError("inputs[0].shape", dims, f"the data holds {len(files)} elements")
        return Pending([(f"inputs[0][{i}]", f) for i, f in enumerate(files)], shape)
    raise RequestError("inputs[0].datatype", dtype, "UINT8 (pixels) or BYTES (PNG/JPEG files)")


def _v2_shape(dims: Any, shape: tuple[int, ...]) -> list[int]:
    """inputs[0].shape as plain JSON integers (true is none, though Python counts it one), at most as
    many as an image batch has: its first, the count, is checked before anything is read."""
    rule = f"a list of 1 to {len(shape) + 1} non-negative integers (true and false are not numbers)"
    if not isinstance(dims, list) or not 1 <= len(dims) <= len(shape) + 1:
        raise RequestError("inputs[0].shape", _short(dims), rule)
    if not all(type(d) is int and d >= 0 for d in dims):
        raise RequestError("inputs[0].shape", _short(dims), rule)
    return dims


def _short(value: Any) -> Any:
    """A shape from a request as an error shows it: a long list by its length (str() of it all would
    cost as much as the request)."""
    return f"{len(value)} dimensions" if isinstance(value, list) and len(value) > 8 else value


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


def _length_prefixed(raw: bytes, count: int) -> list[bytes]:
    """BYTES in the binary extension: each element a 4-byte little-endian length, then its bytes.
    Read up to one element past `count` (shape[0]): a request holding more is refused without
    walking the rest."""
    out, at = [], 0
    while at < len(raw) and len(out) <= count:
        if at + 4 > len(raw):
            raise RequestError("binary data", None, "a BYTES element is cut short (4-byte length, then the bytes)")
        (n,) = struct.unpack_from("<I", raw, at)
        if at + 4 + n > len(raw):
            raise RequestError("binary data", n, "a BYTES element longer than the data sent")
        out.append(raw[at + 4 : at + 4 + n])
        at += 4 + n
    return out


def _b64_list(data: Any, count: int) -> list[bytes]:
    if not isinstance(data, list) or not all(isinstance(d, str) for d in data):
        raise RequestError("inputs[0].data", None, "BYTES data in JSON are base64 strings of image files")
    if len(data) != count:
        raise RequestError("inputs[0].shape", [count], f"the data holds {len(data)} elements")
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


# Ordinary form fields an upload may carry beside its files (a name, a note): counted with the files
# before the body is parsed, since each part costs the parser as much as a file does.
FORM_FIELDS = 8
# The most header bytes one part may have: a browser or curl sends a few hundred; a part without its
# blank line would otherwise have all of its body parsed as header lines.
PART_HEADERS = 16_384


def uploads(body: bytes, content_type: str, shape: tuple[int, ...], max_batch: int) -> tuple[Pending, list[str]]:
    """(file names, images) of a multipart/form-data upload, or of a body that is one image file.

    The parts are split at the boundary and counted before any is parsed (at most `max_batch` files
    and FORM_FIELDS more); only each part's few header lines go through the email parser, never a
    part's body, so a part that is itself multipart is not walked."""
    if not content_type.lower().startswith("multipart/form-data"):
        return Pending([("body", body)], shape), ["body"]
    parts = _parts(body, _boundary(content_type))
    if len(parts) > max_batch + FORM_FIELDS:
        raise RequestError(
            "body",
            f"{len(parts)} parts",
            f"more files than SERVE_MAX_BATCH={max_batch} (and {FORM_FIELDS} other fields); split the request",
        )
    if not parts:
        raise RequestError("body", None, "a multipart/form-data upload without parts; send curl -F file=@image.png")
    names, files = [], []
    for head, payload in parts:
        if len(head) > PART_HEADERS:
            raise RequestError(
                "body", f"{len(head)} bytes of part headers", f"at most {PART_HEADERS}; send the file as it is"
            )
        headers = email.parser.BytesHeaderParser(policy=email.policy.HTTP).parsebytes(head + b"\r\n\r\n")
        name = headers.get_filename()
        if name is None:
            continue  # an ordinary form field
        names.append("".join(ch if ch.isprintable() else "?" for ch in name)[:200])
        files.append(_decoded(payload, headers.get("content-transfer-encoding", ""), names[-1] or "file"))
    if not files:
        raise RequestError("body", None, "no file in the upload; send one as curl -F file=@image.png")
    check_count(len(files), max_batch)
    return Pending([(name or "file", raw) for name, raw in zip(names, files)], shape), names


def _boundary(content_type: str) -> bytes:
    header = email.message.Message()
    header["content-type"] = content_type
    boundary = header.get_boundary()
    if not boundary:
        raise RequestError("content-type", None, "multipart/form-data without a boundary; let the client set it")
    return boundary.encode("latin-1", "replace")


def _parts(body: bytes, boundary: bytes) -> list[tuple[bytes, bytes]]:
    """(header lines, body) of each part between the boundary lines, up to the closing one."""
    out = []
    for chunk in body.split(b"--" + boundary)[1:]:
        if chunk.startswith(b"--"):
            break  # the closing boundary: what follows is the epilogue
        chunk = chunk.removeprefix(b"\r\n").removeprefix(b"\n")
        head, sep, payload = chunk.partition(b"\r\n\r\n")
        if not sep:
            head, sep, payload = chunk.partition(b"\n\n")
        out.append((head, payload.removesuffix(b"\n").removesuffix(b"\r")))
    return out


def _decoded(payload: bytes, encoding: str, name: str) -> bytes:
    """A part's bytes: as sent, or decoded from base64 (the one transfer encoding a client may still use)."""
    if encoding.strip().lower() != "base64":
        return payload
    try:
        return base64.b64decode(payload, validate=False)
    except (binascii.Error, ValueError):
        raise RequestError(name, None, "a base64 part that is not base64; send the file as it is") from None
