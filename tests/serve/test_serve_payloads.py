"""Request bodies to images, called directly: each refusal is asserted whole (what, the value shown,
the fix, the status), since a test that checks a fragment lets a wrong name or number through."""

from __future__ import annotations

import base64
import io
import json
import struct

import numpy as np
import pytest

from train.serve import payloads
from train.serve.payloads import Pending, RequestError

SHAPE = (2, 2, 1)  # the images of these tests: 2x2 gray, 4 pixels
IMAGE = [[[0], [1]], [[2], [3]]]  # one image of SHAPE as nested lists


def _png(width: int = 2, height: int = 2) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.zeros((height, width), np.uint8)).save(out, format="PNG")
    return out.getvalue()


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _refused(call, *args, **kwargs) -> tuple[str, int]:
    """(message, status) of the RequestError the call raises."""
    with pytest.raises(RequestError) as caught:
        call(*args, **kwargs)
    return str(caught.value), caught.value.status


# -- RequestError ------------------------------------------------------------------------------------
def test_a_request_error_shows_name_value_cut_at_80_characters_and_fix():
    error = RequestError("field", "v" * 100, "send less")
    assert str(error) == f"field ({'v' * 80}): send less"
    assert (error.name, error.value, error.fix, error.status, error.retry_after) == (
        "field",
        "v" * 100,
        "send less",
        400,
        None,
    )
    assert str(RequestError("field", None, "send one")) == "field: send one"
    assert str(RequestError("field", 0, "not zero")) == "field (0): not zero"  # a falsy value is still shown
    busy = RequestError("server", None, "busy", 503, retry_after=1)
    assert (busy.status, busy.retry_after) == (503, 1)


# -- parse_json ----------------------------------------------------------------------------------------
def test_json_with_up_to_a_full_batch_of_commas_is_parsed_one_more_is_refused_unparsed():
    most = 4 * 4 + 1000  # SERVE_MAX_BATCH=4 images of 4 pixels, and 1,000 for the keys
    assert payloads.parse_json(json.dumps([0] * (most + 1)).encode(), SHAPE, 4) == [0] * (most + 1)
    assert _refused(payloads.parse_json, json.dumps([0] * (most + 2)).encode(), SHAPE, 4) == (
        "body (over 1,016 values): more than SERVE_MAX_BATCH=4 images of 2x2x1 hold; split the request",
        400,
    )


@pytest.mark.parametrize(
    "body, says",
    [
        (b"", "body: not JSON (Expecting value: line 1 column 1 (char 0)); send a JSON object"),
        (
            b"{",
            "body: not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); send a JSON object",
        ),
        (
            b'"\xff"',
            "body: not JSON ('utf-8' codec can't decode byte 0xff in position 1: invalid start byte); send a JSON object",
        ),
        (b"[" * 100_000 + b"]" * 100_000, "body: JSON nested too deeply; an image is nested only as deep as its shape"),
    ],
    ids=["empty", "cut short", "not UTF-8", "nested"],
)
def test_a_body_that_is_no_json_is_a_400_saying_why(body, says):
    assert _refused(payloads.parse_json, body, SHAPE, 4) == (says, 400)


# -- the count of a request ------------------------------------------------------------------------------
def test_a_batch_of_one_to_max_batch_images_passes_as_it_is():
    assert payloads.check_count(1, 4) == 1 and payloads.check_count(4, 4, "parts") == 4


@pytest.mark.parametrize(
    "count, what, says",
    [
        (0, "batch", "batch (0): no image in the request; send at least one"),
        (5, "batch", "batch (5): more images than SERVE_MAX_BATCH=4; split the request"),
        (0, "inputs[0].shape[0]", "inputs[0].shape[0] (0): no image in the request; send at least one"),
        (5, "inputs[0].shape[0]", "inputs[0].shape[0] (5): more images than SERVE_MAX_BATCH=4; split the request"),
    ],
)
def test_no_image_or_more_than_max_batch_is_a_400_naming_the_count(count, what, says):
    assert _refused(payloads.check_count, count, 4, what) == (says, 400)
    if what == "batch":  # the default name
        assert _refused(payloads.check_count, count, 4) == (says, 400)


# -- pixels --------------------------------------------------------------------------------------------
def test_pixels_0_to_255_become_a_uint8_batch():
    array = payloads.pixels([[[[0], [255]], [[7], [128]]]], SHAPE, "inputs")
    assert array.dtype == np.uint8 and array.tolist() == [[[[0], [255]], [[7], [128]]]]


@pytest.mark.parametrize(
    "value, says",
    [
        ([IMAGE, [[[0], [1]]]], "inputs: ragged nested lists; each image is 2x2x1 uint8"),
        ([[[[0], [1]], [[2], [10**30]]]], "inputs: pixels outside 0..255; the model takes uint8 pixels"),
        ([[[[0], [1]], [[2], [-(10**30)]]]], "inputs: pixels outside 0..255; the model takes uint8 pixels"),
        ([[[[0], [1]], [[2], [256]]]], "inputs: pixels outside 0..255; the model takes uint8 pixels"),
        ([[[[0], [1]], [[2], [-1]]]], "inputs: pixels outside 0..255; the model takes uint8 pixels"),
        ([[[[0], [1]], [[2], [0.5]]]], "inputs: holds floats; the pixels are integers 0..255 (uint8)"),
        ([[[["a"], ["b"]], [["c"], ["d"]]]], "inputs: holds strings; the pixels are integers 0..255 (uint8)"),
        ([[[[True], [False]], [[True], [True]]]], "inputs: holds booleans; the pixels are integers 0..255 (uint8)"),
        ([[[[True], [1]], [[2], [10**30]]]], "inputs: holds mixed values; the pixels are integers 0..255 (uint8)"),
        ([[[[None], [1]], [[2], [3]]]], "inputs: holds mixed values; the pixels are integers 0..255 (uint8)"),
        ([[[[1j], [1]], [[2], [3]]]], "inputs: holds not integers; the pixels are integers 0..255 (uint8)"),
        (
            [[[0], [1]], [[2], [3]]],
            "inputs (shape [2, 2, 1]): the images are 2x2x1 uint8 each: send shape [N, 2, 2, 1]",
        ),
        (
            [[[[0, 0], [1, 1]], [[2, 2], [3, 3]]]],
            "inputs (shape [1, 2, 2, 2]): the images are 2x2x1 uint8 each: send shape [N, 2, 2, 1]",
        ),
        (
            [[[[[0]], [[1]]], [[[2]], [[3]]]]],
            "inputs (shape [1, 2, 2, 1, 1]): the images are 2x2x1 uint8 each: send shape [N, 2, 2, 1]",
        ),
        ([], "inputs (shape [0]): the images are 2x2x1 uint8 each: send shape [N, 2, 2, 1]"),
    ],
    ids=[
        "ragged",
        "beyond int64",
        "below int64",
        "256",
        "-1",
        "floats",
        "strings",
        "booleans",
        "bool and big int",
        "null",
        "complex",
        "no batch axis",
        "channels",
        "one axis more",
        "empty",
    ],
)
def test_pixels_that_are_no_uint8_batch_of_the_shape_are_a_400_saying_what_they_are(value, says):
    assert _refused(payloads.pixels, value, SHAPE, "inputs") == (says, 400)


def test_an_empty_batch_of_the_right_shape_is_no_pixel_error():
    # No pixel to check: the batch's count is refused by the caller (check_count), not as out of range.
    array = payloads.pixels(np.zeros((0, *SHAPE), float), SHAPE, "inputs")
    assert array.dtype == np.uint8 and array.shape == (0, *SHAPE)


# -- Pending ---------------------------------------------------------------------------------------------
def test_pending_counts_the_pixels_the_files_declare_and_decodes_files_and_pixels_in_order():
    pixels = np.full(SHAPE, 9, np.uint8)
    pending = Pending([("a.png", _png(3, 5)), pixels, ("b.png", _png(2, 2))], [2, 2, 1])
    assert pending.pixels == 3 * 5 + 2 * 2 and pending.shape == SHAPE
    images = pending.decode()
    assert images.dtype == np.uint8 and images.shape == (3, *SHAPE)
    assert images[1].tolist() == pixels.tolist() and not images[0].any() and not images[2].any()


def test_pending_of_pixels_has_nothing_to_decode_and_keeps_them():
    images = np.arange(8, dtype=np.uint8).reshape(2, *SHAPE)
    pending = Pending.of(images)
    assert (pending.pixels, pending.shape, len(pending.parts)) == (0, SHAPE, 2)
    assert pending.decode().tolist() == images.tolist()
    empty = Pending([], SHAPE).decode()
    assert empty.dtype == np.uint8 and empty.shape == (0, *SHAPE)


def test_a_file_whose_header_cannot_be_read_is_refused_before_it_is_decoded():
    assert _refused(Pending, [("a.png", _png()), ("b.png", b"not an image")], SHAPE) == (
        "b.png: not an image the model reads (send JPEG, PNG, GIF (first frame) or BMP)",
        400,
    )


def test_an_image_file_the_decoder_refuses_is_a_400_with_its_reason():
    cut = _png()[:-20]  # a readable header, no image data
    message, status = _refused(payloads.image_file, cut, SHAPE, "my cat.png")  # a name with a space
    assert status == 400 and message.startswith("my cat.png: not an image the model reads (not a readable image")
    assert message.endswith(
        "; the formats read are JPEG, PNG, GIF (first frame) or BMP (of 8, 24 or 32 bits a pixel): convert or remove it)"
    )


# -- {"b64": ...} ----------------------------------------------------------------------------------------
def test_a_b64_value_is_the_file_it_encodes():
    assert payloads.b64_image(_b64(b"PNG bytes"), "instances[0]") == ("instances[0]", b"PNG bytes")


@pytest.mark.parametrize(
    "value, says",
    [
        (7, 'instances[0] (int): the "b64" value is a base64 string of a PNG or JPEG file'),
        (None, 'instances[0] (NoneType): the "b64" value is a base64 string of a PNG or JPEG file'),
        ("not base64!", 'instances[0]: the "b64" value is not base64; encode the image file with base64'),
        ("aGk=\n", 'instances[0]: the "b64" value is not base64; encode the image file with base64'),
        ("aGk", 'instances[0]: the "b64" value is not base64; encode the image file with base64'),
        ("é", 'instances[0]: the "b64" value is not base64; encode the image file with base64'),
    ],
    ids=["int", "null", "not base64", "a newline", "unpadded", "not ASCII"],
)
def test_a_b64_value_that_is_no_base64_string_is_a_400(value, says):
    assert _refused(payloads.b64_image, value, "instances[0]") == (says, 400)


# -- TensorFlow Serving's :predict -------------------------------------------------------------------------
def _tf(doc, max_batch=4):
    """(parts as pixel lists or (what, bytes), columnar) of a :predict body."""
    pending, columnar = payloads.tf_serving_images(doc, SHAPE, max_batch)
    assert pending.shape == SHAPE
    return [p if isinstance(p, tuple) else p.tolist() for p in pending.parts], columnar


def test_tf_serving_rows_and_columns_of_pixels_and_files():
    png = _png()
    assert _tf({"instances": [IMAGE, IMAGE]}) == ([IMAGE, IMAGE], False)
    assert _tf({"instances": [{"images": IMAGE}], "signature_name": "serving_default"}) == ([IMAGE], False)
    assert _tf({"instances": [{"b64": _b64(png)}, {"images": {"b64": _b64(png)}}]}) == (
        [("instances[0]", png), ("instances[1]", png)],
        False,
    )
    assert _tf({"inputs": [IMAGE, IMAGE, IMAGE]}) == ([IMAGE] * 3, True)
    assert _tf({"inputs": {"images": [IMAGE]}}) == ([IMAGE], True)
    assert _tf({"inputs": {"b64": _b64(png)}}) == ([("inputs", png)], True)
    assert _tf({"inputs": {"images": {"b64": _b64(png)}}}) == ([("inputs", png)], True)
    assert _tf({"inputs": [{"b64": _b64(png)}, {"b64": _b64(png)}]}) == ([("inputs[0]", png), ("inputs[1]", png)], True)
    assert _tf({"instances": [IMAGE] * 4}) == ([IMAGE] * 4, False)  # SERVE_MAX_BATCH=4 itself
    assert _tf({"inputs": [{"b64": _b64(png)}] * 4})[1] is True


@pytest.mark.parametrize(
    "doc, says",
    [
        ([IMAGE], 'body (list): send a JSON object with "instances" or "inputs"'),
        ({"instances": [IMAGE], "inputs": [IMAGE]}, 'body: both "instances" and "inputs": send one of them'),
        (
            {"instances": [IMAGE], "signature_name": "predict"},
            'signature_name (predict): the export has one signature, "serving_default"',
        ),
        (
            {"inputs": [IMAGE], "signature_name": None},
            'signature_name: the export has one signature, "serving_default"',
        ),
        ({"instances": {"images": [IMAGE]}}, "instances (dict): a list of images, one per row"),
        ({"instances": []}, "batch (0): no image in the request; send at least one"),
        ({"instances": [IMAGE] * 5}, "batch (5): more images than SERVE_MAX_BATCH=4; split the request"),
        ({"instances": [{"b64": "eA=="}] * 5}, "batch (5): more images than SERVE_MAX_BATCH=4; split the request"),
        ({"instances": [IMAGE, {"image": IMAGE}]}, 'instances[1] (image): the model has one input, "images"'),
        (
            {"instances": [{"images": IMAGE, "other": 1}]},
            'instances[0] (images, other): the model has one input, "images"',
        ),
        (
            {"instances": [IMAGE, {"b64": "eA==", "x": 1}]},
            'instances[1] (b64, x): an image is nested pixel lists or {"b64": "..."}',
        ),
        (
            {"instances": [{"images": {"b64": 7}}]},
            'instances[0] (int): the "b64" value is a base64 string of a PNG or JPEG file',
        ),
        (
            {"instances": [IMAGE, [[[0], [1]]]]},
            "instances[1] (shape [1, 1, 2, 1]): the images are 2x2x1 uint8 each: send shape [N, 2, 2, 1]",
        ),
        ({"signature_name": "serving_default"}, 'body (signature_name): no "instances" or "inputs": send one of them'),
        ({}, 'body ({}): no "instances" or "inputs": send one of them'),
        ({"a": 1, "b": 2}, 'body (a, b): no "instances" or "inputs": send one of them'),
        ({"inputs": {"image": [IMAGE]}}, 'inputs (image): the model has one input, "images"'),
        ({"inputs": {"images": [IMAGE], "x": 1}}, 'inputs (images, x): the model has one input, "images"'),
        ({"inputs": {}}, 'inputs ({}): the model has one input, "images"'),
        ({"instances": [{}]}, 'instances[0] ({}): the model has one input, "images"'),
        ({"inputs": {"b64": "eA==", "x": 1}}, 'inputs (b64, x): an image is nested pixel lists or {"b64": "..."}'),
        ({"inputs": []}, "batch (0): no image in the request; send at least one"),
        ({"inputs": [IMAGE] * 5}, "batch (5): more images than SERVE_MAX_BATCH=4; split the request"),
        ({"inputs": [{"b64": "eA=="}] * 5}, "batch (5): more images than SERVE_MAX_BATCH=4; split the request"),
        (
            {"inputs": [{"b64": "eA=="}, {"b64": 1}]},
            'inputs[1] (int): the "b64" value is a base64 string of a PNG or JPEG file',
        ),
        ({"inputs": [{"b64": "eA=="}, IMAGE]}, "inputs: ragged nested lists; each image is 2x2x1 uint8"),
        ({"inputs": [IMAGE, {"b64": "eA=="}]}, "inputs: ragged nested lists; each image is 2x2x1 uint8"),
        ({"inputs": [{"b64": "eA=="}, 7]}, "inputs: holds mixed values; the pixels are integers 0..255 (uint8)"),
        ({"inputs": 7}, "inputs (shape []): the images are 2x2x1 uint8 each: send shape [N, 2, 2, 1]"),
        ({"inputs": IMAGE}, "inputs (shape [2, 2, 1]): the images are 2x2x1 uint8 each: send shape [N, 2, 2, 1]"),
    ],
)
def test_a_tf_serving_body_it_cannot_take_is_a_400_naming_what_and_where(doc, says):
    assert _refused(payloads.tf_serving_images, doc, SHAPE, 4) == (says, 400)


def test_shape_and_dims_are_the_image_shape_as_a_message_writes_it():
    assert payloads._shape((28, 28, 1)) == "28x28x1 uint8" and payloads._dims((28, 28, 1)) == "28, 28, 1"


# -- the Open Inference Protocol -------------------------------------------------------------------------
FLAT = [0, 1, 2, 3]  # IMAGE's pixels, as UINT8 data
TENSOR = {"name": "images", "datatype": "UINT8", "shape": [1, 2, 2, 1], "data": FLAT}


def _v2(doc, header=None, raw=b"", max_batch=4):
    """(parts as pixel lists or (what, bytes), meta) of an infer request: `doc` as JSON, then `raw`."""
    head = json.dumps(doc).encode()
    pending, meta = payloads.v2_request(head + raw, header, SHAPE, "probabilities", max_batch)
    assert pending.shape == SHAPE
    return [p if isinstance(p, tuple) else p.tolist() for p in pending.parts], meta


def _v2_refused(doc, header=None, raw=b"", max_batch=4) -> tuple[str, int]:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode() + raw
    return _refused(payloads.v2_request, body, header, SHAPE, "probabilities", max_batch)


def _elements(*files: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(f)) + f for f in files)


def test_v2_json_uint8_and_bytes_and_what_the_answer_should_be():
    png = _png()
    brightest = payloads.v2_request(
        json.dumps({"inputs": [{**TENSOR, "data": [255] * 4}]}).encode(), None, SHAPE, "probabilities", 4
    )
    assert brightest[0].decode().dtype == np.uint8 and brightest[0].decode().tolist() == [
        [[[255], [255]], [[255], [255]]]
    ]
    assert _v2({"inputs": [TENSOR]}) == ([IMAGE], {"id": None, "binary": False})
    nested = {**TENSOR, "shape": [2, 2, 2, 1], "data": [IMAGE, IMAGE]}
    assert _v2({"id": "r-1", "inputs": [nested], "outputs": [{"name": "probabilities"}]}) == (
        [IMAGE, IMAGE],
        {"id": "r-1", "binary": False},
    )
    files = {"name": "images", "datatype": "BYTES", "shape": [2, 1], "data": [_b64(png), _b64(png)]}
    assert _v2({"inputs": [files], "parameters": {"binary_data_output": True}}) == (
        [("inputs[0][0]", png), ("inputs[0][1]", png)],
        {"id": None, "binary": True},
    )
    one = {**files, "shape": [1], "data": [_b64(png)]}
    assert _v2({"inputs": [one], "outputs": []}) == ([("inputs[0][0]", png)], {"id": None, "binary": False})


def test_v2_binary_flags_default_and_per_output():
    out = {"name": "probabilities"}
    asked = {"inputs": [TENSOR], "parameters": {"binary_data_output": True}}
    assert _v2({**asked, "outputs": [out]})[1]["binary"] is True  # the request's flag for each output
    assert _v2({**asked, "outputs": [{**out, "parameters": {"binary_data": False}}]})[1]["binary"] is False
    assert _v2({"inputs": [TENSOR], "outputs": [{**out, "parameters": {"binary_data": True}}]})[1]["binary"] is True
    assert _v2({"inputs": [TENSOR], "outputs": [{**out, "parameters": None}]})[1]["binary"] is False
    assert _v2({"inputs": [TENSOR], "parameters": None})[1]["binary"] is False


def test_v2_binary_data_after_the_json_part():
    png = _png()
    pixels = bytes(range(8))
    uint8 = {**TENSOR, "shape": [2, 2, 2, 1], "parameters": {"binary_data_size": 8}}
    del uint8["data"]
    head = len(json.dumps({"inputs": [uint8]}))
    assert _v2({"inputs": [uint8]}, str(head), pixels) == (
        [[[[0], [1]], [[2], [3]]], [[[4], [5]], [[6], [7]]]],
        {"id": None, "binary": False},
    )
    raw = _elements(png, png)
    files = {"name": "images", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(raw)}}
    head = len(json.dumps({"inputs": [files]}))
    assert _v2({"inputs": [files]}, str(head), raw)[0] == [("inputs[0][0]", png), ("inputs[0][1]", png)]
    # A header that counts the whole body: no binary part, the JSON's own data is read.
    assert _v2({"inputs": [TENSOR]}, str(len(json.dumps({"inputs": [TENSOR]}))))[0] == [IMAGE]


@pytest.mark.parametrize("header", ["abc", "-1", "1e3", "", "+5", " 5", "5_0", "\u0665"])  # int() took the last four
def test_an_inference_header_length_that_is_no_length_within_the_body_is_a_400(header):
    body = json.dumps({"inputs": [TENSOR]}).encode()
    assert _v2_refused(body, header) == (
        f"Inference-Header-Content-Length ({header}): must be the JSON part's length, 0..{len(body)}",
        400,
    )


def test_an_inference_header_length_past_the_body_or_of_zero_is_refused():
    body = json.dumps({"inputs": [TENSOR]}).encode()
    assert _v2_refused(body, str(len(body) + 1)) == (
        f"Inference-Header-Content-Length ({len(body) + 1}): must be the JSON part's length, 0..{len(body)}",
        400,
    )
    # 0 is a length the header may give: no JSON part then, which the JSON check refuses.
    assert _v2_refused(body, "0") == (
        "body: not JSON (Expecting value: line 1 column 1 (char 0)); send a JSON object",
        400,
    )


@pytest.mark.parametrize(
    "doc, says",
    [
        ([TENSOR], 'body: an inference request is a JSON object with an "inputs" list'),
        ({"inputs": TENSOR}, 'body: an inference request is a JSON object with an "inputs" list'),
        ({"input": [TENSOR]}, 'body: an inference request is a JSON object with an "inputs" list'),
        ({"inputs": []}, 'inputs (0): send exactly one input tensor, "images"'),
        ({"inputs": [TENSOR, TENSOR]}, 'inputs (2): send exactly one input tensor, "images"'),
        ({"inputs": [[0, 1, 2, 3]]}, 'inputs (1): send exactly one input tensor, "images"'),
        ({"id": 7, "inputs": [TENSOR]}, "id (7): a string, or left out"),
        ({"id": "", "inputs": [{**TENSOR, "name": "image"}]}, 'inputs[0].name (image): the model\'s input is "images"'),
        (
            {"inputs": [{k: v for k, v in TENSOR.items() if k != "name"}]},
            'inputs[0].name: the model\'s input is "images"',
        ),
        (
            {"inputs": [TENSOR], "outputs": {"name": "probabilities"}},
            'outputs: a list of objects such as {"name": "probabilities"}',
        ),
        (
            {"inputs": [TENSOR], "outputs": ["probabilities"]},
            'outputs: a list of objects such as {"name": "probabilities"}',
        ),
        (
            {"inputs": [TENSOR], "outputs": [{"name": "probabilities"}, "x"]},
            'outputs: a list of objects such as {"name": "probabilities"}',
        ),
        (
            {"inputs": [TENSOR], "outputs": [{"name": "probabilities"}, {"name": "logits"}]},
            'outputs (logits): the model\'s output is "probabilities"',
        ),
        ({"inputs": [TENSOR], "outputs": [{}]}, 'outputs: the model\'s output is "probabilities"'),
        (
            {
                "inputs": [TENSOR],
                "outputs": [{"name": "probabilities"}, {"name": "probabilities", "parameters": {"classification": 2}}],
            },
            'outputs[1].parameters.classification (2): not supported here: ask for "probabilities" and take the top classes from its probabilities',
        ),
        (
            {"inputs": [TENSOR], "outputs": [{"name": "probabilities"}, {"name": "probabilities", "parameters": []}]},
            "outputs[1].parameters (list): an object of name: value",
        ),
        (
            {
                "inputs": [TENSOR],
                "outputs": [{"name": "probabilities"}, {"name": "probabilities", "parameters": {"binary_data": 0}}],
            },
            "outputs[1].parameters.binary_data (0): true or false (a JSON boolean)",
        ),
        ({"inputs": [TENSOR], "parameters": "binary"}, "parameters (str): an object of name: value"),
        (
            {"inputs": [TENSOR], "parameters": {"binary_data_output": None}},
            "parameters.binary_data_output: true or false (a JSON boolean)",
        ),
        ({"inputs": [{**TENSOR, "parameters": 1}]}, "inputs[0].parameters (int): an object of name: value"),
    ],
)
def test_a_v2_request_it_cannot_take_is_a_400_naming_what_and_where(doc, says):
    assert _v2_refused(doc) == (says, 400)


def _tensor(**changes):
    return {**TENSOR, **changes}


@pytest.mark.parametrize(
    "tensor, says",
    [
        (
            _tensor(shape=None),
            "inputs[0].shape: a list of 1 to 4 non-negative integers (true and false are not numbers)",
        ),
        (
            _tensor(shape=4),
            "inputs[0].shape (4): a list of 1 to 4 non-negative integers (true and false are not numbers)",
        ),
        (
            _tensor(shape=[]),
            "inputs[0].shape ([]): a list of 1 to 4 non-negative integers (true and false are not numbers)",
        ),
        (
            _tensor(shape=[1, 2, 2, 1, 1]),
            "inputs[0].shape ([1, 2, 2, 1, 1]): a list of 1 to 4 non-negative integers (true and false are not numbers)",
        ),
        (
            _tensor(shape=[1] * 8),
            "inputs[0].shape ([1, 1, 1, 1, 1, 1, 1, 1]): a list of 1 to 4 non-negative integers (true and false are not numbers)",
        ),
        (
            _tensor(shape=[1] * 9),
            "inputs[0].shape (9 dimensions): a list of 1 to 4 non-negative integers (true and false are not numbers)",
        ),
        (
            _tensor(shape=[1, 2, -2, 1]),
            "inputs[0].shape ([1, 2, -2, 1]): a list of 1 to 4 non-negative integers (true and false are not numbers)",
        ),
        (
            _tensor(shape=[True, 2, 2, 1]),
            "inputs[0].shape ([True, 2, 2, 1]): a list of 1 to 4 non-negative integers (true and false are not numbers)",
        ),
        (
            _tensor(shape=[1, 2, 2.0, 1]),
            "inputs[0].shape ([1, 2, 2.0, 1]): a list of 1 to 4 non-negative integers (true and false are not numbers)",
        ),
        (_tensor(shape=[0, 2, 2, 1], data=[]), "inputs[0].shape[0] (0): no image in the request; send at least one"),
        (_tensor(shape=[5, 2, 2, 1]), "inputs[0].shape[0] (5): more images than SERVE_MAX_BATCH=4; split the request"),
        (_tensor(shape=[1, 2, 1, 2]), "inputs[0].shape ([1, 2, 1, 2]): UINT8 images are [N, 2, 2, 1]"),
        (_tensor(shape=[1, 2, 2]), "inputs[0].shape ([1, 2, 2]): UINT8 images are [N, 2, 2, 1]"),
        (_tensor(shape=[4]), "inputs[0].shape ([4]): UINT8 images are [N, 2, 2, 1]"),
        (_tensor(datatype="FP32"), "inputs[0].datatype (FP32): UINT8 (pixels) or BYTES (PNG/JPEG files)"),
        (_tensor(datatype=None), "inputs[0].datatype: UINT8 (pixels) or BYTES (PNG/JPEG files)"),
        (
            _tensor(parameters={"binary_data_size": 4}),
            "binary_data_size (4): the binary part after the JSON holds 0 bytes",
        ),
        (_tensor(data=[0, 1, 2]), "inputs[0].data (3 values): the shape given needs 4"),
        (_tensor(data=None), "inputs[0].data (0 values): the shape given needs 4"),
        (_tensor(data=[[0, 1], [2]]), "inputs[0].data: ragged nested lists"),
        (_tensor(data=[0, 1, 2, 256]), "inputs[0].data: UINT8 data are integers 0..255"),
        (_tensor(data=[0, 1, 2, -1]), "inputs[0].data: UINT8 data are integers 0..255"),
        (_tensor(data=[0, 1, 2, 0.5]), "inputs[0].data: UINT8 data are integers 0..255"),
        (_tensor(data=["0", "1", "2", "3"]), "inputs[0].data: UINT8 data are integers 0..255"),
        (
            _tensor(datatype="BYTES", shape=[1, 2], data=["eA=="]),
            "inputs[0].shape ([1, 2]): BYTES inputs are image files, shape [N] or [N, 1]",
        ),
        (
            _tensor(datatype="BYTES", shape=[1, 1, 1], data=["eA=="]),
            "inputs[0].shape ([1, 1, 1]): BYTES inputs are image files, shape [N] or [N, 1]",
        ),
        (_tensor(datatype="BYTES", shape=[2], data=["eA=="]), "inputs[0].shape ([2]): the data holds 1 elements"),
        (
            _tensor(datatype="BYTES", shape=[1], data="eA=="),
            "inputs[0].data: BYTES data in JSON are base64 strings of image files",
        ),
        (
            _tensor(datatype="BYTES", shape=[1], data=[7]),
            "inputs[0].data: BYTES data in JSON are base64 strings of image files",
        ),
        (
            _tensor(datatype="BYTES", shape=[2], data=["eA==", 7]),
            "inputs[0].data: BYTES data in JSON are base64 strings of image files",
        ),
        (
            _tensor(datatype="BYTES", shape=[1], data=["eA"]),
            "inputs[0].data: not base64; encode each image file with base64",
        ),
        (
            _tensor(datatype="BYTES", shape=[1], data=["eA==\n"]),
            "inputs[0].data: not base64; encode each image file with base64",
        ),
        (
            _tensor(datatype="BYTES", shape=[1], data=["é"]),
            "inputs[0].data: not base64; encode each image file with base64",
        ),
        (
            _tensor(datatype="BYTES", shape=[1], data=["eA=="]),
            "inputs[0][0]: not an image the model reads (send JPEG, PNG, GIF (first frame) or BMP)",
        ),
    ],
)
def test_a_v2_tensor_it_cannot_take_is_a_400_naming_what_is_wrong(tensor, says):
    assert _v2_refused({"inputs": [tensor]}) == (says, 400)


def _binary(tensor: dict, raw: bytes, size=None) -> tuple[bytes, str]:
    tensor = {k: v for k, v in tensor.items() if k != "data"}
    tensor["parameters"] = {"binary_data_size": len(raw) if size is None else size}
    head = json.dumps({"inputs": [tensor]}).encode()
    return head + raw, str(len(head))


@pytest.mark.parametrize(
    "tensor, raw, size, says",
    [
        (TENSOR, bytes(4), 5, "binary_data_size (5): the binary part after the JSON holds 4 bytes"),
        (TENSOR, bytes(4), "4", "binary_data_size (4): the binary part after the JSON holds 4 bytes"),
        (TENSOR, bytes(5), None, "binary_data_size (5): shape [1, 2, 2, 1] of UINT8 needs 4 bytes"),
        (TENSOR, bytes(3), None, "binary_data_size (3): shape [1, 2, 2, 1] of UINT8 needs 4 bytes"),
        (
            _tensor(datatype="BYTES", shape=[1]),
            b"\x01\x00\x00",
            None,
            "binary data: a BYTES element is cut short (4-byte length, then the bytes)",
        ),
        (
            _tensor(datatype="BYTES", shape=[1]),
            _elements(b"x") + b"\x01",
            None,
            "binary data: a BYTES element is cut short (4-byte length, then the bytes)",
        ),
        (
            _tensor(datatype="BYTES", shape=[1]),
            _elements(b"x")[:-1],
            None,
            "binary data (1): a BYTES element longer than the data sent",
        ),
        (
            _tensor(datatype="BYTES", shape=[1]),
            struct.pack("<I", 2**32 - 1),
            None,
            "binary data (4294967295): a BYTES element longer than the data sent",
        ),
        (
            _tensor(datatype="BYTES", shape=[2]),
            _elements(b"x"),
            None,
            "inputs[0].shape ([2]): the data holds 1 elements",
        ),
        (
            _tensor(datatype="BYTES", shape=[1]),
            _elements(b"x", b"y"),
            None,
            "inputs[0].shape ([1]): the data holds 2 elements",
        ),
        (_tensor(datatype="BYTES", shape=[1]), b"", None, "inputs[0].shape ([1]): the data holds 0 elements"),
    ],
    ids=[
        "size differs",
        "size a string",
        "UINT8 more",
        "UINT8 less",
        "cut length",
        "cut second length",
        "cut bytes",
        "huge length",
        "fewer",
        "more",
        "none",
    ],
)
def test_binary_data_that_does_not_match_its_tensor_is_a_400(tensor, raw, size, says):
    body, header = _binary(tensor, raw, size)
    assert _refused(payloads.v2_request, body, header, SHAPE, "probabilities", 4) == (says, 400)


def test_length_prefixed_elements_are_read_up_to_one_past_the_count():
    raw = _elements(b"a", b"", b"ccc")
    assert payloads._length_prefixed(raw, 3) == [b"a", b"", b"ccc"]
    assert payloads._length_prefixed(raw, 1) == [b"a", b""]  # one past: enough to refuse a longer request
    assert payloads._length_prefixed(raw + b"\x05", 1) == [b"a", b""]  # the rest is never walked
    assert payloads._length_prefixed(b"", 3) == []


@pytest.mark.parametrize(
    "value, shown", [([1] * 9, "9 dimensions"), ([1] * 8, [1] * 8), ("x" * 20, "x" * 20), (None, None)]
)
def test_a_shape_is_shown_whole_up_to_8_dimensions(value, shown):
    assert payloads._short(value) == shown


def test_v2_response_as_json_or_binary_with_the_header_length():
    class Model:
        name, output_name = "model", "probabilities"

    probs = np.array([[0.25, 0.75], [1.0, 0.0]], np.float64)
    body, headers = payloads.v2_response(Model, probs, {"id": "r-1", "binary": False})
    out = {"name": "probabilities", "datatype": "FP32", "shape": [2, 2], "data": [0.25, 0.75, 1.0, 0.0]}
    assert json.loads(body) == {"model_name": "model", "model_version": "1", "outputs": [out], "id": "r-1"}
    assert headers == {"content-type": "application/json"}
    body, headers = payloads.v2_response(Model, probs, {"id": None, "binary": True})
    head = int(headers["inference-header-content-length"])
    assert headers == {"content-type": "application/octet-stream", "inference-header-content-length": str(head)}
    binary = {"name": "probabilities", "datatype": "FP32", "shape": [2, 2], "parameters": {"binary_data_size": 16}}
    assert json.loads(body[:head]) == {"model_name": "model", "model_version": "1", "outputs": [binary]}
    assert body[head:] == np.array([0.25, 0.75, 1.0, 0.0], "<f4").tobytes()


# -- plain uploads -----------------------------------------------------------------------------------------
def _form(*parts: bytes, boundary: str = "b0undary", newline: bytes = b"\r\n", epilogue: bytes = b"") -> bytes:
    """A multipart body of the given parts (each its header lines, a blank line, its bytes)."""
    mark = b"--" + boundary.encode()
    return b"".join(mark + newline + part + newline for part in parts) + mark + b"--" + newline + epilogue


def _file(name: str, data: bytes, *headers: str, newline: bytes = b"\r\n") -> bytes:
    lines = [f'Content-Disposition: form-data; name="file"; filename="{name}"', *headers]
    return newline.join(line.encode() for line in lines) + newline * 2 + data


FORM = "multipart/form-data; boundary=b0undary"


def _upload(body: bytes, content_type: str = FORM, max_batch: int = 4):
    pending, names = payloads.uploads(body, content_type, SHAPE, max_batch)
    assert pending.shape == SHAPE
    return pending.parts, names


def test_an_upload_is_its_files_by_name_and_a_plain_body_is_one_file():
    png = _png()
    field = b'Content-Disposition: form-data; name="note"\r\n\r\nhello'
    body = _form(field, _file("a.png", png), _file("b.png", png))
    assert _upload(body) == ([("a.png", png), ("b.png", png)], ["a.png", "b.png"])
    assert _upload(body, "Multipart/Form-Data; boundary=b0undary")[1] == ["a.png", "b.png"]
    assert _upload(png, "image/png") == ([("body", png)], ["body"])
    assert _upload(png, "") == ([("body", png)], ["body"])


def test_an_upload_of_max_batch_files_and_form_fields_is_taken():
    png = _png()
    fields = [f'Content-Disposition: form-data; name="f{i}"\r\n\r\nx'.encode() for i in range(payloads.FORM_FIELDS)]
    body = _form(*fields, *(_file(f"{i}.png", png) for i in range(4)))
    assert _upload(body)[1] == ["0.png", "1.png", "2.png", "3.png"]


def test_file_names_are_made_printable_cut_at_200_and_an_empty_one_is_called_file():
    png = _png()
    body = _form(_file("a\x1bb.png", png), _file("n" * 300, png), _file("", png))
    parts, names = _upload(body)
    assert names == ["a?b.png", "n" * 200, ""]
    assert [name for name, _ in parts] == ["a?b.png", "n" * 200, "file"]


def test_a_part_may_end_its_lines_with_a_bare_newline_and_the_epilogue_is_not_read():
    png = _png()
    body = _form(_file("a.png", png, newline=b"\n"), newline=b"\n", epilogue=b"--b0undary\r\nnot a part\r\n")
    assert _upload(body) == ([("a.png", png)], ["a.png"])


def test_a_part_in_base64_is_decoded_and_one_in_another_encoding_is_taken_as_sent():
    png = _png()
    wrapped = base64.encodebytes(png)  # lines of 76 characters: a newline is skipped, not an error
    body = _form(
        _file("a.png", wrapped, "Content-Transfer-Encoding:  BASE64 "),
        _file("b.png", png, "Content-Transfer-Encoding: binary"),
    )
    assert _upload(body) == ([("a.png", png), ("b.png", png)], ["a.png", "b.png"])


@pytest.mark.parametrize(
    "body, content_type, says",
    [
        (
            _form(b"x"),
            "multipart/form-data",
            "content-type: multipart/form-data without a boundary; let the client set it",
        ),
        (
            _form(b"x"),
            "multipart/form-data; boundary=",
            "content-type: multipart/form-data without a boundary; let the client set it",
        ),
        (b"--b0undary--\r\n", FORM, "body: a multipart/form-data upload without parts; send curl -F file=@image.png"),
        (b"no boundary line", FORM, "body: a multipart/form-data upload without parts; send curl -F file=@image.png"),
        (
            _form(b'Content-Disposition: form-data; name="note"\r\n\r\nhello'),
            FORM,
            "body: no file in the upload; send one as curl -F file=@image.png",
        ),
        (
            _form(*[_file(f"{i}.png", b"") for i in range(5)]),
            FORM,
            "batch (5): more images than SERVE_MAX_BATCH=4; split the request",
        ),
        (
            _form(*[b"X: y\r\n\r\n"] * 13),
            FORM,
            "body (13 parts): more files than SERVE_MAX_BATCH=4 (and 8 other fields); split the request",
        ),
        (
            _form(b"X: " + b"y" * 16_382 + b"\r\n\r\n"),
            FORM,
            "body (16385 bytes of part headers): at most 16384; send the file as it is",
        ),
        (
            _form(_file("a.png", b"abcde", "Content-Transfer-Encoding: base64")),
            FORM,
            "a.png: a base64 part that is not base64; send the file as it is",
        ),
        (
            _form(_file("", b"abcde", "Content-Transfer-Encoding: base64")),
            FORM,
            "file: a base64 part that is not base64; send the file as it is",
        ),
        (
            _form(_file("a.png", b"not an image")),
            FORM,
            "a.png: not an image the model reads (send JPEG, PNG, GIF (first frame) or BMP)",
        ),
    ],
    ids=[
        "no boundary",
        "empty boundary",
        "no part",
        "no boundary line",
        "no file",
        "files",
        "parts",
        "headers",
        "bad base64",
        "bad base64 unnamed",
        "no image",
    ],
)
def test_an_upload_it_cannot_take_is_a_400_naming_what_is_wrong(body, content_type, says):
    assert _refused(payloads.uploads, body, content_type, SHAPE, 4) == (says, 400)


def test_part_headers_of_16384_bytes_are_read():
    png = _png()
    header = "X: " + "y" * (16_384 - len(_file("a.png", b"").removesuffix(b"\r\n\r\n")) - 5)
    part = _file("a.png", png, header)
    assert len(part.partition(b"\r\n\r\n")[0]) == 16_384
    assert _upload(_form(part))[1] == ["a.png"]


def test_parts_split_at_the_boundary_with_either_line_ending():
    assert payloads._parts(b"preamble--B\r\nA: 1\r\n\r\nxy\r\n--B\nA: 2\n\nz\n--B--\r\nafter", b"B") == [
        (b"A: 1", b"xy"),
        (b"A: 2", b"z"),
    ]
    assert payloads._parts(b"--B\r\nno blank line\r\n--B--", b"B") == [(b"no blank line\r\n", b"")]
    assert payloads._parts(b"--B\r\nA: 1\r\n\r\nxy\r\r\n--B--", b"B") == [
        (b"A: 1", b"xy\r")
    ]  # one line ending taken off, not two
    assert payloads._boundary('multipart/form-data; boundary="a b"') == b"a b"
    assert payloads._boundary("multipart/form-data; boundary=\u00e9") == "\u00e9".encode("latin-1")
    assert payloads._boundary("multipart/form-data; boundary=a\u20acb") == b"a?b"  # beyond Latin-1: no 500
