"""Unit-level checks of train.run.checkpoints: fallback from corrupt states, no silent fresh start, shape checks."""

from __future__ import annotations

import itertools
import logging
import re

import numpy as np
import pytest

from train.errors import CheckpointError, DivergedError
from train.run.checkpoints import LATEST, latest_header, list_states, load_latest, read_state, restore, save_state
from train.run.files import atomic_write, clean_stale_temp

_SEEDS = itertools.count()


def _model(width=8, optimizer="adam"):
    import keras

    keras.utils.set_random_seed(0)
    m = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(width, name="hidden"), keras.layers.Dense(2, name="head")]
    )
    m.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    # The state a step of training leaves (optimizer slots built, a step counted, no slot zero),
    # without tracing a training step (most of each test's time); each model's slots differ, so that
    # a restore that skipped them would be seen.
    m.optimizer.build(m.trainable_variables)
    rng = np.random.default_rng(next(_SEEDS))
    for v in m.optimizer.variables:
        v.assign(1 if v is m.optimizer.iterations else rng.uniform(0.1, 1, v.shape).astype(v.dtype))
    return m


def _states(tmp_path, model, steps=(4, 8, 12)):
    for s in steps:
        save_state(tmp_path, model, {"epoch": 0, "step": s, "global_step": s, "best": None, "batch_size": 4}, keep=3)
    return list_states(tmp_path)


def _garbage(p):
    p.write_bytes(b"garbage" * 50)


def _truncate(p):
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _flip(p):
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0xFF
    p.write_bytes(bytes(b))


@pytest.mark.parametrize("damage", [_garbage, _truncate, _flip])
def test_a_damaged_latest_state_falls_back_with_a_warning_naming_it(tmp_path, caplog, damage):
    newest, middle, _ = _states(tmp_path, _model())
    damage(newest)
    with caplog.at_level(logging.WARNING, logger="train"):
        loaded = load_latest(tmp_path)
    assert loaded.path == middle and loaded.meta["global_step"] == 8
    assert newest.name in caplog.text and "falling back" in caplog.text


def test_no_valid_state_is_an_error_never_a_fresh_start(tmp_path):
    for p in _states(tmp_path, _model()):
        _truncate(p)
    with pytest.raises(CheckpointError, match="no valid checkpoint .*ckpt-000000012.npz"):
        load_latest(tmp_path)


def test_no_state_at_all_means_a_fresh_start(tmp_path):
    assert load_latest(tmp_path) is None


def test_newest_state_wins_over_a_pointer_left_behind_by_a_kill(tmp_path):
    """Killed between a state's os.replace and the pointer update: the newer, complete state loads."""
    states = _states(tmp_path, _model())
    assert (tmp_path / LATEST).read_text().strip() == states[0].name  # the pointer moves with each save
    (tmp_path / LATEST).write_text(states[1].name + "\n")
    assert load_latest(tmp_path).path == states[0]
    (tmp_path / LATEST).write_text("ckpt-000000999.npz\n")
    assert load_latest(tmp_path).path == states[0]


def test_only_keep_states_are_kept(tmp_path):
    names = [p.name for p in _states(tmp_path, _model(), steps=(1, 2, 3, 4, 5))]
    assert names == ["ckpt-000000005.npz", "ckpt-000000004.npz", "ckpt-000000003.npz"]


def test_a_writer_that_dies_half_way_leaves_the_old_file_and_a_temp_that_start_cleans(tmp_path):
    model = _model()
    (good,) = _states(tmp_path, model, steps=(4,))

    def dies_half_way(p):
        p.write_bytes(b"PK\x03\x04half")
        raise KeyboardInterrupt  # like a kill: no OSError handling

    with pytest.raises(KeyboardInterrupt):
        atomic_write(good, dies_half_way)
    assert read_state(good).meta["global_step"] == 4
    (tmp_path / f"ckpt-000000008{'.tmp-'}abc.npz").write_bytes(b"half")  # what SIGKILL leaves
    assert [p.name for p in clean_stale_temp(tmp_path)] == ["ckpt-000000008.tmp-abc.npz"]
    assert load_latest(tmp_path).path == good


def test_a_diverged_state_is_never_saved(tmp_path):
    model = _model()
    (good,) = _states(tmp_path, model, steps=(4,))
    model.layers[0].kernel.assign(np.full(model.layers[0].kernel.shape, np.nan, "float32"))
    with pytest.raises(DivergedError, match="hidden/kernel holds NaN.*LEARNING_RATE"):
        _states(tmp_path, model, steps=(8,))
    assert list_states(tmp_path) == [good] and load_latest(tmp_path).path == good


def test_a_different_width_is_refused_naming_the_variable_and_both_shapes(tmp_path):
    _states(tmp_path, _model(width=8), steps=(4,))
    model, loaded = _model(width=16), load_latest(tmp_path)
    with pytest.raises(CheckpointError) as info:
        restore(model, loaded)
    path, saved_as = model.layers[0].kernel.path, loaded.meta["model_variables"][0][0]
    assert str(info.value) == (
        f"model variable {path} has shape (4, 16) in the model but (4, 8) in checkpoint ckpt-000000004.npz (saved as "
        f"{saved_as}): the architecture changed; resume with the run's own settings or start a new run"
    )


def test_another_number_of_layers_is_refused_with_both_counts(tmp_path):
    import keras

    _states(tmp_path, _model(), steps=(4,))
    deeper = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, name="hidden"),
            keras.layers.Dense(8, name="more"),
            keras.layers.Dense(2, name="head"),
        ]
    )
    deeper.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    with pytest.raises(CheckpointError) as info:
        restore(deeper, load_latest(tmp_path))
    assert str(info.value) == (
        "checkpoint ckpt-000000004.npz has 4 model variables, the current model has 6: "
        "the architecture changed; resume with the run's own MODEL or start a new run"
    )


def test_an_array_that_does_not_match_its_own_header_is_refused(tmp_path):
    (path,) = _states(tmp_path, _model(), steps=(4,))
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["m00000"] = np.zeros((4, 9), "float32")  # the header still says (4, 8)
    np.savez(path, **arrays)
    with pytest.raises(CheckpointError, match=r"has shape \(4, 8\) in the model but \(4, 8\) in checkpoint"):
        restore(_model(), load_latest(tmp_path))


def test_an_optimizer_that_cannot_be_restored_is_an_error(tmp_path):
    _states(tmp_path, _model(optimizer="adam"), steps=(4,))
    with pytest.raises(CheckpointError) as info:
        restore(_model(optimizer="sgd"), load_latest(tmp_path))
    assert re.fullmatch(
        r"the optimizer state cannot be restored: checkpoint ckpt-000000004\.npz has \d+ optimizer "
        r"variables, the current model has \d+: the architecture changed; .*",
        str(info.value),
    )


def test_restore_is_exact(tmp_path):
    model = _model()
    _states(tmp_path, model, steps=(4,))
    other = _model()
    other.layers[0].kernel.assign(np.zeros(other.layers[0].kernel.shape, "float32"))
    restore(other, load_latest(tmp_path))
    for a, b in zip(other.variables + other.optimizer.variables, model.variables + model.optimizer.variables):
        assert np.array_equal(a.numpy(), b.numpy()), a.path


def test_the_pointer_moves_only_after_the_state_file_is_in_place(tmp_path, monkeypatch):
    """A kill between the two renames must leave a pointer to a complete state, never to a missing one."""
    import os

    renamed, real_replace = [], os.replace

    def replace(src, dst):
        real_replace(src, dst)
        renamed.append(os.path.basename(dst))
        if os.path.basename(dst) == LATEST:  # what the pointer names exists when the pointer moves
            assert (tmp_path / (tmp_path / LATEST).read_text().strip()).is_file()

    model = _model()
    monkeypatch.setattr(os, "replace", replace)
    _states(tmp_path, model, steps=(4, 8))
    assert renamed == ["ckpt-000000004.npz", LATEST, "ckpt-000000008.npz", LATEST]


def test_a_missing_directory_has_no_states(tmp_path):
    assert list_states(tmp_path / "missing") == [] and load_latest(tmp_path / "missing") is None


def test_only_state_files_are_listed_newest_first(tmp_path):
    for name in (
        "ckpt-000000010.npz",
        "ckpt-000000002.npz",
        "ckpt-000000010.npz.tmp-x",
        "LATEST",
        "ckpt-10.npz",
        "best.weights.h5",
    ):
        (tmp_path / name).write_text("")
    assert [p.name for p in list_states(tmp_path)] == ["ckpt-000000010.npz", "ckpt-000000002.npz"]


def test_a_state_whose_header_does_not_match_its_arrays_is_incomplete(tmp_path):
    import json

    model = _model()
    (path,) = _states(tmp_path, model, steps=(4,))
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["__meta__"].tobytes().decode())
    for key in ("model_variables", "optimizer_variables"):
        bad = dict(meta, **{key: meta[key] + [["extra", [1]]]})
        np.savez(path, **dict(arrays, __meta__=np.frombuffer(json.dumps(bad).encode(), np.uint8)))
        with pytest.raises(CheckpointError) as info:
            read_state(path)
        assert str(info.value) == f"checkpoint {path} is incomplete: variable count does not match its header"


def test_unreadable_states_are_named_in_the_warning_and_the_error(tmp_path, caplog):
    states = _states(tmp_path, _model())
    for p in states:
        p.write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="train"), pytest.raises(CheckpointError) as info:
        load_latest(tmp_path)
    assert str(info.value) == (
        f"no valid checkpoint in {tmp_path} (unreadable: ckpt-000000012.npz, ckpt-000000008.npz, ckpt-000000004.npz); "
        "start a new run without --resume (resume=None in train()), or restore the files from a backup"
    )
    # The template's own lines (TensorFlow may warn about retracing in the same test: its logger is not ours)
    ours = [r for r in caplog.records if r.name == "train"]
    first = ours[0].getMessage()
    assert first.startswith(f"WARNING: checkpoint {states[0]} is unreadable (ValueError: ")
    assert first.endswith("; falling back to an older checkpoint") and len(ours) == 3


def test_restore_into_a_fresh_model_builds_its_optimizer_and_logs_the_path(tmp_path, caplog):
    import keras

    model = _model()
    (path,) = _states(tmp_path, model, steps=(4,))
    fresh = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, name="hidden"), keras.layers.Dense(2, name="head")]
    )
    fresh.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    assert not fresh.optimizer.built
    with caplog.at_level(logging.INFO, logger="train"):
        restore(fresh, load_latest(tmp_path))
    assert f"restored from checkpoint: {path}" in caplog.messages
    for a, b in zip(fresh.variables + fresh.optimizer.variables, model.variables + model.optimizer.variables):
        assert np.array_equal(a.numpy(), b.numpy()), a.path


def test_the_saved_header_holds_the_state_and_every_variable(tmp_path):
    model = _model()
    state = {"epoch": 2, "step": 5, "global_step": 29, "best": 0.75, "batch_size": 16, "batch_halvings": 1}
    path = save_state(tmp_path, model, state, keep=3)
    assert path == tmp_path / "ckpt-000000029.npz"
    meta = read_state(path).meta
    assert {k: meta[k] for k in state} == state
    assert meta["model_variables"] == [[v.path, list(v.shape)] for v in model.variables]
    assert meta["optimizer_variables"] == [[v.path, list(v.shape)] for v in model.optimizer.variables]


def test_weights_sha256_covers_each_variable_path_dtype_and_bytes():
    import hashlib

    from train.run.checkpoints import weights_sha256

    model = _model()
    h = hashlib.sha256()
    for v in model.variables:
        h.update(v.path.encode() + str(v.numpy().dtype).encode() + np.ascontiguousarray(v.numpy()).tobytes())
    assert weights_sha256(model) == h.hexdigest()


def test_latest_header_is_the_newest_readable_states_header_without_its_arrays(tmp_path):
    assert latest_header(tmp_path) is None
    newest, middle, _ = _states(tmp_path, _model())
    assert latest_header(tmp_path) == read_state(newest).meta
    newest.write_bytes(b"garbage")  # unreadable: the next one answers
    assert latest_header(tmp_path)["global_step"] == 8 == read_state(middle).meta["global_step"]
    for p in list_states(tmp_path):
        p.write_bytes(b"PK\x03\x04half")
    assert latest_header(tmp_path) is None


def test_a_state_value_json_cannot_hold_is_saved_as_text_not_refused(tmp_path):
    path = save_state(tmp_path, _model(), {"epoch": 0, "step": 1, "global_step": 1, "best": np.float32(0.5)}, keep=3)
    assert read_state(path).meta["best"] == "0.5"
