import os
import stat

import pytest

from sapo.protocol.peers.identity import IdentityError, load_or_create_identity, peer_id_of


def test_created_owner_only(tmp_path):
    key_pair = load_or_create_identity(tmp_path / "data")
    path = tmp_path / "data" / "identity.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert peer_id_of(key_pair).startswith("12D3KooW")  # Ed25519 peer ids
    assert [p.name for p in path.parent.iterdir()] == ["identity.key"]  # no temp file left


def test_same_peer_id_on_reload(tmp_path):
    first = peer_id_of(load_or_create_identity(tmp_path))
    second = peer_id_of(load_or_create_identity(tmp_path))
    assert first == second


def test_reloaded_key_signs_like_the_original(tmp_path):
    original = load_or_create_identity(tmp_path)
    reloaded = load_or_create_identity(tmp_path)
    signature = reloaded.private_key.sign(b"rollout")
    assert original.public_key.verify(b"rollout", signature)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_readable_by_others_is_refused(tmp_path, mode):
    load_or_create_identity(tmp_path)
    path = tmp_path / "identity.key"
    os.chmod(path, mode)
    with pytest.raises(IdentityError) as error:
        load_or_create_identity(tmp_path)
    assert str(path) in str(error.value)
    assert "chmod 600" in str(error.value)


@pytest.mark.parametrize("content", [b"", b"not a key", b"\x08\x01\x12\x05short"])
def test_corrupt_file_is_refused(tmp_path, content):
    path = tmp_path / "identity.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content)
    os.close(fd)
    with pytest.raises(IdentityError) as error:
        load_or_create_identity(tmp_path)
    assert str(path) in str(error.value)
    assert "corrupt" in str(error.value)
