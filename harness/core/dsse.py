"""DSSE envelopes (the signature wrapper of in-toto attestations) signed and checked with ed25519 keys.

An envelope is `{payloadType, payload (base64), signatures: [{keyid, sig (base64)}]}`; the signature is over the
pre-authentication encoding `DSSEv1 <len(type)> <type> <len(payload)> <payload>`
(https://github.com/secure-systems-lab/dsse/blob/master/protocol.md). Keys are PEM files (PKCS#8 private keys,
SubjectPublicKeyInfo public keys, as `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` write them);
a key's id is the SHA-256 of its raw public bytes. The cryptography is the `cryptography` package's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from harness.core.digests import ManifestError


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def keyid(key: Ed25519PublicKey) -> str:
    """A public key's id: the SHA-256 (hex) of its 32 raw bytes."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ManifestError(f"{what} {path}: {exc.strerror or exc}") from None


def signing_key(path: Path) -> Ed25519PrivateKey:
    """The ed25519 private key in the PEM file `path` (unencrypted PKCS#8)."""
    data = _read(path, "--sign-key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise ManifestError(f"--sign-key {path}: the key is encrypted; pass an unencrypted PEM key") from None
    except (ValueError, UnsupportedAlgorithm):
        raise ManifestError(f"--sign-key {path} is not a PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ManifestError(f"--sign-key {path} is not an ed25519 key ({type(key).__name__})")
    return key


def public_key(path: Path) -> Ed25519PublicKey:
    """The ed25519 public key in the PEM file `path`."""
    data = _read(path, "--key")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise ManifestError(f"--key {path} is not a PEM public key (openssl pkey -in KEY -pubout)") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ManifestError(f"--key {path} is not an ed25519 key ({type(key).__name__})")
    return key


def sign(payload: bytes, payload_type: str, key: Ed25519PrivateKey) -> dict[str, Any]:
    """The envelope of `payload`, signed with `key`."""
    sig = key.sign(pae(payload_type, payload))
    return {"payloadType": payload_type, "payload": base64.b64encode(payload).decode(),
            "signatures": [{"keyid": keyid(key.public_key()), "sig": base64.b64encode(sig).decode()}]}


@dataclass(frozen=True)
class Envelope:
    """A parsed envelope: its payload type, payload and (keyid, signature) pairs."""

    payload_type: str
    payload: bytes
    signatures: tuple[tuple[str, bytes], ...]

    def verifies(self, key: Ed25519PublicKey) -> bool:
        """Whether a signature of `key`'s id is `key`'s over this payload."""
        wanted = keyid(key)
        for kid, sig in self.signatures:
            if kid != wanted:
                continue
            try:
                key.verify(sig, pae(self.payload_type, self.payload))
                return True
            except InvalidSignature:
                return False
        return False


def parse(doc: Any, where: str) -> Envelope:
    """An envelope from its JSON document (ManifestError, naming `where`, when it is not one)."""
    sigs = doc.get("signatures") if isinstance(doc, dict) else None
    if not (isinstance(doc, dict) and isinstance(doc.get("payloadType"), str) and isinstance(doc.get("payload"), str)
            and isinstance(sigs, list) and sigs
            and all(isinstance(s, dict) and isinstance(s.get("keyid"), str) and isinstance(s.get("sig"), str)
                    for s in sigs)):
        raise ManifestError(f"{where} is not a DSSE envelope (payloadType, payload, signatures: [{{keyid, sig}}])")
    try:
        return Envelope(doc["payloadType"], base64.b64decode(doc["payload"], validate=True),
                        tuple((s["keyid"], base64.b64decode(s["sig"], validate=True)) for s in sigs))
    except (binascii.Error, ValueError):
        raise ManifestError(f"{where}: its payload or a signature is not base64") from None
