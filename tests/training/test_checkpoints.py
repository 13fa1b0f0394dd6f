import os

import pytest

from sapo.training.learning.checkpoints import CheckpointError, latest_checkpoint, save_checkpoint


def writer(payload: bytes):
    def write_model(path):
        path.mkdir()
        (path / "model.safetensors").write_bytes(payload)
        (path / "config.json").write_text("{}")

    return write_model


def save(root, round_index, payload=b"w" * 1000, keep=3):
    return save_checkpoint(root, round_index, writer(payload), {"opt": [1, 2]}, {"round": round_index}, keep=keep)


def test_roundtrip_and_keep_newest(tmp_path):
    for r in range(1, 6):
        save(tmp_path, r)
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt.round == 5 and ckpt.state() == {"round": 5}
    assert ckpt.trainer_state() == {"opt": [1, 2]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round-00000003", "round-00000004", "round-00000005"]


def test_corrupt_latest_falls_back_loudly(tmp_path, caplog):
    save(tmp_path, 1)
    bad = save(tmp_path, 2)
    (bad.model_dir / "model.safetensors").write_bytes(b"garbage")
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt.round == 1
    assert "model.safetensors" in caplog.text and "corrupt" in caplog.text


def test_truncated_file_and_missing_manifest_are_detected(tmp_path):
    first = save(tmp_path, 1)
    os.truncate(first.model_dir / "model.safetensors", 10)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        latest_checkpoint(tmp_path)
    second = save(tmp_path, 2)
    (second.path / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        latest_checkpoint(tmp_path)


def test_interrupted_write_leaves_previous_checkpoint(tmp_path):
    save(tmp_path, 1)

    def crash(path):
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(CheckpointError, match="No space left"):
        save_checkpoint(tmp_path, 2, crash, {}, {"round": 2})
    assert latest_checkpoint(tmp_path).round == 1
    assert [p.name for p in tmp_path.iterdir()] == ["round-00000001"]


def test_partial_directory_from_a_crash_is_ignored(tmp_path):
    save(tmp_path, 1)
    (tmp_path / ".partial-round-00000002-999").mkdir()
    assert latest_checkpoint(tmp_path).round == 1
    assert not (tmp_path / ".partial-round-00000002-999").exists()


def test_no_checkpoint_means_fresh_start(tmp_path):
    assert latest_checkpoint(tmp_path / "none") is None


def test_unusable_data_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "data"
    blocker.write_text("a file where the data directory should be")
    with pytest.raises(CheckpointError, match="cannot create checkpoint directory"):
        save(blocker / "checkpoints", 1)
