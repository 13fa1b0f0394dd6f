"""Peer identity: one Ed25519 key per node, kept in DATA_DIR/identity.key.

The peer id is derived from the public key, so keeping the key file keeps the node's
peer id across restarts (peers that list us as a bootstrap address depend on that).
The file holds libp2p's protobuf serialisation of the private key and is owner-only.
"""

from __future__ import annotations

import os
import pathlib
import stat

from libp2p.crypto.ed25519 import Ed25519PrivateKey, create_new_key_pair
from libp2p.crypto.keys import KeyPair, KeyType
from libp2p.crypto.serialization import deserialize_private_key
from libp2p.peer.id import ID

IDENTITY_FILE_NAME = "identity.key"


class IdentityError(Exception):
    """The identity key file is unusable; the message names the file and the fix."""


def peer_id_of(key_pair: KeyPair) -> str:
    """The base58 peer id (``12D3Koo...``) that ``key_pair`` signs as."""
    return ID.from_pubkey(key_pair.public_key).to_base58()


def load_or_create_identity(data_dir: pathlib.Path, seed: bytes | None = None) -> KeyPair:
    """Load the node's key from ``data_dir/identity.key``, creating it on first start.

    ``seed`` (32 bytes) derives the key deterministically, so a local demo swarm can know its
    bootstrap node's peer id in advance. Anyone who knows the seed can act as that node.
    """
    path = pathlib.Path(data_dir) / IDENTITY_FILE_NAME
    if not path.exists():
        try:
            _create_identity_file(path, seed)
        except FileExistsError:
            pass  # another process created it between our check and our create: load theirs
    return _load_identity_file(path)


def _create_identity_file(path: pathlib.Path, seed: bytes | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    key_pair = create_new_key_pair(seed) if seed is not None else create_new_key_pair()
    data = key_pair.private_key.serialize()
    # Write a 0600 temp file, fsync it, then rename: a crash never leaves a half-written key
    # under the real name. O_EXCL on both names means we never clobber an existing key.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # the umask can only remove bits, but be explicit
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if path.exists():
            raise FileExistsError(path)
        os.rename(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def _load_identity_file(path: pathlib.Path) -> KeyPair:
    try:
        mode = path.stat().st_mode
    except OSError as error:
        raise IdentityError(f"cannot read identity key {path}: {error}") from error
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise IdentityError(
            f"identity key {path} is accessible by group/others (mode {stat.S_IMODE(mode):o}); "
            f"anyone who reads it can impersonate this node. Fix: chmod 600 {path}"
        )
    try:
        data = path.read_bytes()
        private_key = deserialize_private_key(data)
        if private_key.get_type() != KeyType.Ed25519:
            raise ValueError(f"key type is {private_key.get_type().name}, expected Ed25519")
        if len(private_key.to_bytes()) != 32:
            raise ValueError("Ed25519 seed is not 32 bytes")
    except Exception as error:
        raise IdentityError(
            f"identity key {path} is corrupt ({error}). Fix: restore it from a backup, or "
            f"delete it to start under a new peer id (peers that list the old id must be updated)"
        ) from error
    assert isinstance(private_key, Ed25519PrivateKey)
    return KeyPair(private_key, private_key.get_public_key())
