"""An encrypting payload codec: AES-256-GCM.

Needs the `cryptography` package: `pip install 'durably[crypto]'`.

    codec = AesGcmCodec(new_key, old_key)       # encrypt with the first, decrypt with any
    engine = durably.Engine(store=..., codec=codec)

At rest every payload becomes one JSON string, a versioned envelope:

    "aesgcm:v1:<kid>:<base64url(nonce ‖ ciphertext ‖ tag)>"

- the key is 256 bits (32 raw bytes, or their base64/base64url/hex text);
- the nonce is 96 random bits drawn per value (so equal payloads encrypt differently; keep
  well under 2**32 values per key, i.e. rotate keys);
- the plaintext is the payload's strict JSON (no NaN/Infinity), UTF-8;
- `kid` is a public fingerprint of the key (8 base64url characters of a SHA-256 over the key),
  so a value names the key that decrypts it: rotation is "put the new key first, keep the old
  ones until nothing references them";
- the associated data is `durably/aesgcm/v1/<kid>`: the version and the key id cannot be
  relabelled without failing authentication. The ciphertext is NOT bound to its row: a payload
  codec is `encode(value)` without a location, and the engine moves payloads between rows
  (a child's output into its parent's checkpoint, a fan's outputs into one folded row), each
  time decoding and re-encoding. Someone able to write the database can therefore swap two
  valid ciphertexts, but cannot read, forge or alter one.

`accept_plaintext=True` lets `decode` pass through values that are not envelopes — for
turning encryption on over a database that already holds cleartext payloads; leave it off
afterwards, since it also accepts cleartext that someone wrote into the database.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from typing import Any

from durably._core import jsonutil
from durably._core.models import JSONValue
from durably._store.codec import CodecError

ENVELOPE_VERSION = "v1"
_PREFIX = f"aesgcm:{ENVELOPE_VERSION}:"
_NONCE_BYTES = 12
_KEY_BYTES = 32
_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")

KeyMaterial = bytes | bytearray | memoryview | str


def _aesgcm() -> tuple[Any, type[Exception]]:
    try:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:  # pragma: no cover - exercised without the extra
        raise ImportError(
            "AesGcmCodec needs the 'cryptography' package; install the extra: "
            "pip install 'durably[crypto]'"
        ) from exc
    return AESGCM, InvalidTag


def _b64e(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64d(text: str) -> bytes:
    padded = text + "=" * (-len(text) % 4)
    return base64.urlsafe_b64decode(padded.encode("ascii"))


def _key_bytes(key: KeyMaterial) -> bytes:
    if isinstance(key, str):
        text = key.strip()
        if _HEX_KEY.fullmatch(text):
            raw = bytes.fromhex(text)
        else:
            try:
                raw = _b64d(text.replace("+", "-").replace("/", "_"))
            except (binascii.Error, ValueError) as exc:
                raise ValueError("an AES-256-GCM key text must be base64 or hex") from exc
    else:
        raw = bytes(key)
    if len(raw) != _KEY_BYTES:
        raise ValueError(f"an AES-256-GCM key is {_KEY_BYTES} bytes, got {len(raw)}")
    return raw


def key_id(key: KeyMaterial) -> str:
    """The public fingerprint naming `key` in envelopes (8 base64url characters)."""
    digest = hashlib.sha256(b"durably/aesgcm/key-id\x00" + _key_bytes(key)).digest()
    return _b64e(digest[:6])


class AesGcmCodec:
    """A payload codec encrypting each payload with AES-256-GCM (see the module doc).

    `AesGcmCodec(key, *previous_keys)`: encrypts with `key`, decrypts values written under
    any of the keys. `AesGcmCodec.generate_key()` returns a fresh key as base64url text.
    """

    def __init__(
        self, key: KeyMaterial, *previous_keys: KeyMaterial, accept_plaintext: bool = False
    ):
        aesgcm, self._invalid_tag = _aesgcm()
        self._ciphers: dict[str, Any] = {}
        for material in (key, *previous_keys):
            raw = _key_bytes(material)
            kid = key_id(raw)
            if kid in self._ciphers:
                raise ValueError(f"key {kid} is given twice")
            self._ciphers[kid] = aesgcm(raw)
        self._kid = next(iter(self._ciphers))
        self._accept_plaintext = accept_plaintext

    @staticmethod
    def generate_key() -> str:
        """A fresh random 256-bit key as unpadded base64url text."""
        return _b64e(os.urandom(_KEY_BYTES))

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The configured keys' ids; the first encrypts."""
        return tuple(self._ciphers)

    def __repr__(self) -> str:  # never shows key material
        return f"AesGcmCodec(key_ids={self.key_ids!r})"

    @staticmethod
    def _aad(kid: str) -> bytes:
        return f"durably/aesgcm/{ENVELOPE_VERSION}/{kid}".encode("ascii")

    def encode(self, value: JSONValue) -> JSONValue:
        plaintext = jsonutil.dumps(value).encode("utf-8")
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._ciphers[self._kid].encrypt(nonce, plaintext, self._aad(self._kid))
        return f"{_PREFIX}{self._kid}:{_b64e(nonce + sealed)}"

    def decode(self, value: JSONValue) -> JSONValue:
        if not (isinstance(value, str) and value.startswith("aesgcm:")):
            if self._accept_plaintext:
                return value
            raise CodecError("the stored value is not an AesGcmCodec envelope")
        parts = value.split(":")
        if len(parts) != 4 or parts[1] != ENVELOPE_VERSION:
            raise CodecError(f"unsupported AesGcmCodec envelope {':'.join(parts[:2])!r}")
        kid, data = parts[2], parts[3]
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise CodecError(
                f"the value was encrypted with key {kid}, which is not among the configured "
                f"keys {list(self._ciphers)}"
            )
        try:
            blob = _b64d(data)
        except (binascii.Error, ValueError) as exc:
            raise CodecError("the AesGcmCodec envelope is corrupt") from exc
        if len(blob) < _NONCE_BYTES + 16:
            raise CodecError("the AesGcmCodec envelope is truncated")
        try:
            plaintext = cipher.decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], self._aad(kid))
        except self._invalid_tag as exc:
            raise CodecError(
                "decryption failed: the value was altered or the key is wrong"
            ) from exc
        return jsonutil.loads(plaintext)


__all__ = ["AesGcmCodec", "key_id"]
