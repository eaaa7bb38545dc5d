"""`serve`: both protocols and /predict answer what `predict` answers; bad requests get one JSON error.

Against a real server process (tests/servers_serve.py); the v2 protocol also through tritonclient,
a stock client of it, unchanged.
"""

from __future__ import annotations

import base64
import json
import socket

import numpy as np
import pytest
from PIL import Image
from servers_serve import LABELS, SHAPE, get, post_json, request

from train.errors import ExportError
from train.results.predict import predict_files


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Three 6x6 PNGs (decoded as they are) and two larger PNG/JPEG files (resized by the decode)."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(3)
    files = []
    for i in range(3):
        path = root / f"small{i}.png"
        Image.fromarray(rng.integers(0, 256, (6, 6), dtype=np.uint8)).save(path)
        files.append(path)
    Image.fromarray(rng.integers(0, 256, (20, 14, 3), dtype=np.uint8)).save(root / "big.png")
    Image.fromarray(rng.integers(0, 256, (30, 30, 3), dtype=np.uint8)).save(root / "big.jpg", quality=90)
    return files + [root / "big.png", root / "big.jpg"]


@pytest.fixture(scope="module")
def expected(served_run, images):
    return predict_files(served_run, [str(f) for f in images])


def _pixels(path) -> list:
    return np.asarray(Image.open(path)).reshape(SHAPE).tolist()


def _b64(path) -> dict:
    return {"b64": base64.b64encode(path.read_bytes()).decode()}


def _same_as_predict(probs, rows):
    assert len(probs) == len(rows)
    for p, row in zip(probs, rows):
        assert int(np.argmax(p)) == row["index"] and LABELS[row["index"]] == row["class"]
        assert p[row["index"]] == pytest.approx(row["probability"], abs=1e-5)
        assert sum(p) == pytest.approx(1.0, abs=1e-5)


def test_tf_serving_status_and_metadata_have_its_shape(serve_server):
    status, doc = get(serve_server.url + "/v1/models/model")
    assert status == 200 and doc["model_version_status"][0]["state"] == "AVAILABLE"
    assert get(serve_server.url + "/v1/models/model/versions/1")[1] == doc
    status, meta = get(serve_server.url + "/v1/models/model/metadata")
    signature = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    dims = [int(d["size"]) for d in signature["inputs"]["images"]["tensor_shape"]["dim"]]
    assert status == 200 and meta["model_spec"]["name"] == "model" and dims == [-1, *SHAPE]
    assert signature["inputs"]["images"]["dtype"] == "DT_UINT8"


def test_tf_serving_predict_rows_and_columns_answer_as_predict(serve_server, images, expected):
    url = serve_server.url + "/v1/models/model:predict"
    status, doc = post_json(url, {"instances": [_pixels(f) for f in images[:3]]})
    assert status == 200 and list(doc) == ["predictions"]
    _same_as_predict(doc["predictions"], expected[:3])
    status, doc = post_json(url, {"instances": [{"images": _b64(f)} for f in images]})
    assert status == 200
    _same_as_predict(doc["predictions"], expected)
    status, doc = post_json(url, {"inputs": {"images": [_pixels(f) for f in images[:3]]}})
    assert status == 200 and list(doc) == ["outputs"]
    _same_as_predict(doc["outputs"], expected[:3])
    status, doc = post_json(url.replace("model:", "model/versions/1:"), {"inputs": [_b64(f) for f in images[3:]]})
    assert status == 200
    _same_as_predict(doc["outputs"], expected[3:])
    status, doc = post_json(url, {"inputs": {"images": _b64(images[4])}})
    assert status == 200
    _same_as_predict(doc["outputs"], expected[4:])


def test_v2_health_metadata_and_json_infer(serve_server, images, expected):
    url = serve_server.url
    assert get(url + "/v2/health/live")[0] == 200 and get(url + "/v2/health/ready")[0] == 200
    assert get(url + "/v2/models/model/ready")[0] == 200
    status, meta = get(url + "/v2/models/model")
    assert status == 200 and meta["inputs"] == [{"name": "images", "datatype": "UINT8", "shape": [-1, *SHAPE]}]
    assert meta["outputs"][0]["name"] == "probabilities" and meta["outputs"][0]["shape"] == [-1, len(LABELS)]
    pixels = np.stack([np.asarray(_pixels(f), np.uint8) for f in images[:3]])
    tensor = {"name": "images", "datatype": "UINT8", "shape": list(pixels.shape), "data": pixels.reshape(-1).tolist()}
    status, doc = post_json(url + "/v2/models/model/infer", {"id": "r1", "inputs": [tensor]})
    assert status == 200 and doc["id"] == "r1" and doc["model_name"] == "model"
    (out,) = doc["outputs"]
    assert out["name"] == "probabilities" and out["datatype"] == "FP32" and out["shape"] == [3, len(LABELS)]
    _same_as_predict(np.reshape(out["data"], out["shape"]), expected[:3])


def test_a_stock_v2_client_works_unchanged(serve_server, images, expected):
    """tritonclient's HTTP client, with its defaults: binary tensors both ways."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{serve_server.port}")
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("model")
        meta = client.get_model_metadata("model")
        assert meta["inputs"][0]["datatype"] == "UINT8"
        pixels = np.stack([np.asarray(_pixels(f), np.uint8) for f in images[:3]])
        tensor = httpclient.InferInput("images", list(pixels.shape), "UINT8")
        tensor.set_data_from_numpy(pixels)
        probs = client.infer("model", [tensor]).as_numpy("probabilities")
        _same_as_predict(probs, expected[:3])
        files = np.array([f.read_bytes() for f in images], dtype=np.object_)
        encoded = httpclient.InferInput("images", [len(files)], "BYTES")
        encoded.set_data_from_numpy(files)
        wanted = [httpclient.InferRequestedOutput("probabilities", binary_data=False)]
        result = client.infer("model", [encoded], outputs=wanted)
        _same_as_predict(result.as_numpy("probabilities"), expected)
    finally:
        client.close()


def test_plain_predict_takes_file_uploads_and_names_the_classes(serve_server, images, expected):
    boundary = "----serve-test"
    parts = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{f.name}"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\n".encode()
        + f.read_bytes()
        + b"\r\n"
        for f in images
    )
    body = parts + f"--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    status, _, raw = request(serve_server.url + "/predict", body, headers)
    doc = json.loads(raw)
    assert status == 200, doc
    rows = doc["predictions"]
    assert [r["file"] for r in rows] == [f.name for f in images]
    for row, want in zip(rows, expected):
        assert row["class"] == want["class"] and row["probability"] == pytest.approx(want["probability"], abs=1e-5)
        assert set(row["probabilities"]) == set(LABELS)
    status, _, raw = request(serve_server.url + "/predict", images[3].read_bytes(), {"Content-Type": "image/png"})
    assert status == 200 and json.loads(raw)["predictions"][0]["class"] == expected[3]["class"]


_PIXELS = np.zeros(SHAPE, np.uint8).tolist()
_V2 = "/v2/models/model/infer"
_TF = "/v1/models/model:predict"
BAD = [
    (_TF, b"{not json", 400, "not JSON"),
    (_TF, {"instances": [_PIXELS], "inputs": [_PIXELS]}, 400, "both"),
    (_TF, {"instance": [_PIXELS]}, 400, 'no "instances" or "inputs"'),
    (_TF, {"instances": [np.zeros((5, 6, 1), int).tolist()]}, 400, "6x6x1"),
    (_TF, {"instances": [np.zeros((6, 6, 1)).tolist()]}, 400, "floats"),
    (_TF, {"instances": [[["a"] * 1] * 6] * 6}, 400, "strings"),
    (_TF, {"instances": [np.full(SHAPE, 300).tolist()]}, 400, "0..255"),
    (_TF, {"instances": [[[[0], [0, 0]]]]}, 400, "ragged"),
    (_TF, {"instances": [{"b64": base64.b64encode(b"not an image").decode()}]}, 400, "not an image"),
    (_TF, {"instances": [{"b64": "%%%"}]}, 400, "not base64"),
    (_TF, {"instances": [_PIXELS] * 9}, 400, "SERVE_MAX_BATCH=8"),
    (_TF, {"instances": []}, 400, "no image"),
    (_TF, {"instances": [_PIXELS], "signature_name": "other"}, 400, "serving_default"),
    ("/v1/models/other:predict", {"instances": [_PIXELS]}, 404, "other"),
    ("/v1/models/model/versions/7:predict", {"instances": [_PIXELS]}, 404, "version (7)"),
    (_V2, b"[1, 2", 400, "not JSON"),
    (_V2, {"inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 6, 6, 1], "data": [0] * 36}]}, 400, "UINT8"),
    (_V2, {"inputs": [{"name": "images", "datatype": "UINT8", "shape": [1, 6, 6], "data": [0] * 36}]}, 400, "shape"),
    (_V2, {"inputs": [{"name": "images", "datatype": "UINT8", "shape": [1, 6, 6, 1], "data": [0] * 35}]}, 400, "36"),
    (_V2, {"inputs": [{"name": "pixels", "datatype": "UINT8", "shape": [1, 6, 6, 1], "data": [0] * 36}]}, 400, "name"),
    (
        _V2,
        {"inputs": [{"name": "images", "datatype": "BYTES", "shape": [1], "data": ["bm90IGFuIGltYWdl"]}]},
        400,
        "not an image",
    ),
    (
        _V2,
        {
            "inputs": [{"name": "images", "datatype": "UINT8", "shape": [1, 6, 6, 1], "data": [0] * 36}],
            "outputs": ["x"],
        },
        400,
        "outputs",
    ),
    (
        _V2,
        {
            "inputs": [
                {"name": "images", "datatype": "UINT8", "shape": [1, 6, 6, 1], "data": [0] * 36, "parameters": []}
            ]
        },
        400,
        "parameters",
    ),
    (
        _V2,
        {"inputs": [{"name": "images", "datatype": "UINT8", "shape": [1, 6, 6, 1], "data": [0] * 36}], "parameters": 7},
        400,
        "parameters",
    ),
    (_TF, b"[" * 100000 + b"]" * 100000, 400, "nested too deeply"),
    ("/v2/models/other/infer", {"inputs": []}, 404, "other"),
    ("/predict", b"plain text", 400, "not an image"),
    ("/nowhere", b"", 404, "/nowhere"),
]


@pytest.mark.parametrize("path, body, status, says", BAD, ids=[f"{p} {s}" for p, _, _, s in BAD])
def test_a_bad_request_gets_one_json_error_naming_it_and_the_server_lives_on(serve_server, path, body, status, says):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    got, headers, answer = request(serve_server.url + path, raw, {"Content-Type": "application/json"}, "POST")
    doc = json.loads(answer)
    assert got == status and list(doc) == ["error"] and says in doc["error"], doc
    assert "\n" not in doc["error"] and headers["content-type"] == "application/json"
    assert get(serve_server.url + "/v2/health/ready")[0] == 200


def test_a_body_over_the_limit_is_refused_before_it_is_read(serve_server):
    """Content-Length says 1 GB and nothing follows: the answer comes at once, not after a read."""
    with socket.create_connection(("127.0.0.1", serve_server.port), timeout=120) as sock:
        sock.sendall(
            b"POST /v1/models/model:predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000\r\n\r\n{"
        )
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and b"SERVE_MAX_BODY_MB" in body, answer


def test_an_export_folder_without_source_json_is_not_called_a_run(served_run, tmp_path, caplog):
    import shutil

    from train.serve.model import find_export

    export = tmp_path / "model-copy"
    shutil.copytree(served_run / "export", export)
    (export / "source.json").unlink()
    with caplog.at_level("WARNING", logger="train"):
        model = find_export(export, None, "model")
    assert f"the export folder {export} has no source.json" in caplog.text, caplog.text
    assert "run model-copy" not in caplog.text and "export model-copy" not in caplog.text
    (export / "savedmodel" / "saved_model.pb").write_bytes(b"damaged")  # it was "the export of run model-copy"
    with pytest.raises(ExportError, match=rf"^the export folder {export} \(.*copy the whole export/ folder of its run"):
        model.load(1)


def test_a_runs_export_folder_named_by_its_path_gives_the_commands_for_the_runs_folder(served_run, tmp_path):
    import shutil

    from train.serve.model import find_export

    run = tmp_path / "elsewhere" / served_run.name
    shutil.copytree(served_run, run)
    (run / "export" / "labels.txt").unlink()
    with pytest.raises(ExportError) as err:  # RUNS_DIR is ./runs: pasted without --runs-dir, it looked there
        find_export(run / "export", None, "model", "./runs").load(1)
    assert str(err.value).endswith(f"`python -m train export {run.name} --runs-dir {run.parent}`")


def test_an_export_swapped_in_while_serve_checks_or_before_it_loads_is_checked_and_loaded_instead(
    served_run, tmp_path, monkeypatch
):
    import shutil

    from train.errors import ExportError
    from train.results import export, predict
    from train.run.rundir import ExportDir
    from train.serve import model as served

    run = tmp_path / served_run.name
    shutil.copytree(served_run, run)
    exp = ExportDir(run / "export")

    def staged(labels: str, damaged: bool) -> ExportDir:  # the next export, its labels.txt another file
        new = ExportDir(run / "export.tmp-new")
        shutil.copytree(exp.path, new.path)
        new.labels.write_text(labels)
        export.write_source(new, None)
        if damaged:
            new.labels.write_text(labels + "eel\n")
        return new

    new, real = staged("cat\ndog\r\n", damaged=False), predict._recorded_file_sha256

    def swapped_first(*args):  # export swaps its folder in between source.json's read and the files'
        if new.path.exists():
            export._swap_into_place(new.path, exp.path)
        return real(*args)

    monkeypatch.setattr(predict, "_recorded_file_sha256", swapped_first)
    monkeypatch.setattr(served, "open_savedmodel", lambda *a: ((1,), lambda batch: batch))
    model = served.find_export(None, run, "model")  # not called damaged
    monkeypatch.setattr(predict, "_recorded_file_sha256", real)
    export._swap_into_place(staged("cat\ndog\n", damaged=True).path, exp.path)  # after the check, before the load
    with pytest.raises(ExportError, match="labels.txt has sha256"):
        model.load(1)  # the export loaded is one checked
