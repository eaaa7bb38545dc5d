"""4. Image-directory pipeline vs a per-file PIL loop; and the share of step time spent waiting for data."""

from __future__ import annotations

import time

import common
import numpy as np

GOAL_SPEEDUP = 10.0
GOAL_WAIT = 0.05


def _image_dir(root, classes: int, per_class: int, seed: int = 0):
    """root/class_k/*.jpg|png, sizes 80..160 px (all shrunk to IMAGE_SIZE=64), JPEG and PNG alternating."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(classes):
        d = root / f"class_{c}"
        d.mkdir(parents=True)
        for i in range(per_class):
            h, w = (int(v) for v in rng.integers(80, 161, 2))
            pixels = rng.integers(0, 90, (h, w, 3)).astype(np.uint8)
            pixels[..., c % 3] += 150
            Image.fromarray(pixels).save(d / f"{i:04d}.{'png' if i % 2 else 'jpg'}")
    return root


def pil_loop(root, size: int) -> np.ndarray:
    """The naive loader: open, convert, resize, stack, one file at a time."""
    from PIL import Image

    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        for f in sorted(d.iterdir()):
            with Image.open(f) as im:
                out.append(np.asarray(im.convert("RGB").resize((size, size), Image.BILINEAR)))
    return np.stack(out)


def decode_image_dir_to_array(path, settings) -> np.ndarray:
    """All images under `path` as uint8 (N, S, S, C): the pipeline's cold decode, no cache."""
    import os

    from train.inputs.images import decode_files, list_image_dir, scan_files

    _, rels, _ = list_image_dir(path)
    _, info = scan_files(path, rels, settings.max_image_pixels)  # the header pass every decode takes
    out = np.empty((len(rels), settings.image_size, settings.image_size, settings.channels), np.uint8)
    decode_files([os.path.join(path, r) for r in rels], out.shape[1:], info, out)
    return out


def test_image_pipeline_vs_pil(benchmark, quick, tmp_path):
    from train.inputs import pipeline as data

    per_class = 30 if quick else 300
    root = _image_dir(tmp_path / "images", 4, per_class)
    n = 4 * per_class
    s = common.settings(dataset=f"images:{root}", runs_dir=str(tmp_path / "runs"))
    decode_image_dir_to_array(root, s)  # TensorFlow's start-up and the page cache, outside the timing
    pil_loop(root, s.image_size)
    spec = data.load_data(s)  # fills the in-memory cache (CACHE=memory, the default)

    def cached_epoch() -> float:
        t0 = time.perf_counter()
        for _ in data.train_dataset(spec, s, epoch=0, batch_size=s.batch_size):
            pass
        return spec.n_train / (time.perf_counter() - t0)

    runs = {
        "pil_loop": lambda: n / common.timed(lambda: pil_loop(root, s.image_size))[0],
        "decode": lambda: n / common.timed(lambda: decode_image_dir_to_array(root, s))[0],
        "cached_epoch": cached_epoch,
    }
    got = common.once(benchmark, lambda: common.interleave(runs, 1 if quick else 3))
    ips = {k: common.median(v) for k, v in got.items()}
    first = common.ratio(ips["decode"], ips["pil_loop"])
    cached = common.ratio(ips["cached_epoch"], ips["pil_loop"])
    common.record(
        benchmark,
        "4a. images/s: pipeline / PIL loop (cached epochs; first decode pass in figures)",
        f">= {GOAL_SPEEDUP}x",
        cached,
        cached is not None and cached >= GOAL_SPEEDUP,
        images=n,
        images_per_second=ips,
        first_pass_ratio=first,
        cached_epoch_ratio=cached,
        first_pass_meets_goal=first is not None and first >= GOAL_SPEEDUP,
    )


def test_data_wait_share(benchmark, quick, tmp_path):
    """Training on an image directory: time blocked in next(iterator) vs time in the train step."""
    import keras

    from train.inputs import pipeline as data

    per_class = 30 if quick else 250
    root = _image_dir(tmp_path / "images", 4, per_class, seed=1)
    s = common.as_a_new_run(common.settings(dataset=f"images:{root}", runs_dir=str(tmp_path / "runs")))
    spec, model = common.template_parts(s)
    waits, steps = [], []

    def epoch(e: int) -> None:
        it = iter(data.train_dataset(spec, s, epoch=e, batch_size=s.batch_size))
        while True:
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                return
            t1 = time.perf_counter()
            model.train_on_batch(x, y)
            t2 = time.perf_counter()
            if e > 0:  # epoch 0 traces the step
                waits.append(t1 - t0)
                steps.append(t2 - t1)

    keras.utils.set_random_seed(s.seed)
    common.once(benchmark, lambda: [epoch(e) for e in range(2 if quick else 3)])
    share = sum(waits) / (sum(waits) + sum(steps))
    common.record(
        benchmark,
        "4b. share of step time waiting for data (image dir, cached)",
        f"< {GOAL_WAIT:.0%}",
        round(share, 4),
        share < GOAL_WAIT,
        steps=len(steps),
        wait_ms_median=1000 * common.median(waits),
        step_ms_median=1000 * common.median(steps),
        model=s.model,
        image_size=s.image_size,
        batch_size=s.batch_size,
    )
