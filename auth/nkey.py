"""A user's nkey seed and the Ed25519 signature a NATS client makes with it when it connects.

A connection with credentials signs the server's nonce with the seed of its ``.creds`` file.
nats-py does it with ``nkeys``, whose import is PyNaCl's whole ``nacl.bindings`` package (its
every binding, on each CLI call); a signature needs the seed decoded and one libsodium
call, which is what this module does (the ``nkeys`` package itself is still the issuer's:
:mod:`hfai.auth.issuer`). The seed format (nkeys, and the Go library it follows): base32 without
padding of two prefix bytes (the seed's, and the key type: user, account, ...), the 32 bytes of
the Ed25519 seed, and a CRC-16 (XMODEM) of those 34 bytes, little-endian.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from hfai.protocol.errors import InvalidRequest

#: The first prefix byte of every encoded seed (base32: "S..."), and the key types one may be of.
PREFIX_BYTE_SEED = 18 << 3
#: Operator, server, cluster, account, user (the types a seed's key may be, as nkeys accepts them).
PUBLIC_PREFIX_BYTES = frozenset({14 << 3, 13 << 3, 2 << 3, 0, 20 << 3})
SEED_BYTES = 32
SIGNATURE_BYTES = 64


def decode_seed(seed: str | bytes) -> bytes:
    """The 32 bytes of Ed25519 seed in an encoded nkey seed (``SU...``); InvalidRequest for
    anything else (not base32, another prefix, the wrong length, a checksum that does not match)."""
    text = seed.encode() if isinstance(seed, str) else bytes(seed)
    try:
        raw = base64.b32decode(text + b"=" * (-len(text) % 8))
    except (binascii.Error, ValueError):
        raise InvalidRequest("not an nkey seed (not base32)") from None
    if len(raw) != 2 + SEED_BYTES + 2:
        raise InvalidRequest(f"not an nkey seed ({len(raw)} bytes, not {2 + SEED_BYTES + 2})")
    body, crc = raw[:-2], int.from_bytes(raw[-2:], "little")
    if binascii.crc_hqx(body, 0) != crc:  # CRC-16/XMODEM, as nkeys computes it
        raise InvalidRequest("not an nkey seed (its checksum does not match)")
    kind = (raw[0] & 7) << 5 | (raw[1] & 248) >> 3
    if raw[0] & 248 != PREFIX_BYTE_SEED or kind not in PUBLIC_PREFIX_BYTES:
        raise InvalidRequest("not an nkey seed (wrong prefix)")
    return body[2:]


def sign(seed: str | bytes, data: bytes) -> bytes:
    """The Ed25519 signature (64 bytes) of ``data`` by the key of the encoded nkey ``seed``: what
    ``nkeys.from_seed(seed).sign(data)`` returns."""
    raw = decode_seed(seed)
    ffi, lib = _libsodium()
    if ffi is None:  # a PyNaCl without its cffi module where this one looks: its public bindings
        from nacl.bindings import crypto_sign, crypto_sign_seed_keypair

        return crypto_sign(data, crypto_sign_seed_keypair(raw)[1])[:SIGNATURE_BYTES]
    pk, sk = ffi.new("unsigned char[]", 32), ffi.new("unsigned char[]", 64)
    signed, signed_len = ffi.new("unsigned char[]", len(data) + SIGNATURE_BYTES), ffi.new("unsigned long long *")
    try:
        if lib.crypto_sign_seed_keypair(pk, sk, raw) != 0 or lib.crypto_sign(signed, signed_len, data, len(data), sk):
            raise RuntimeError("libsodium could not sign")
        return ffi.buffer(signed, SIGNATURE_BYTES)[:]
    finally:
        lib.sodium_memzero(sk, 64)


def _libsodium() -> tuple[Any, Any]:
    """(ffi, lib) of PyNaCl's libsodium module, initialised as PyNaCl initialises it; (None,
    None) where that module is not there (then :func:`sign` uses ``nacl.bindings``). The one
    place that reaches into PyNaCl's private ``nacl._sodium``: tests/test_cli_startup_adapters.py
    fails where a PyNaCl release moves it or it signs otherwise than ``nacl.bindings``."""
    try:
        from nacl._sodium import ffi, lib  # type: ignore[import-not-found]  # PyNaCl's cffi module alone
    except ImportError:
        try:
            import nacl  # noqa: F401  (PyNaCl itself missing: say which package)
        except ImportError:
            raise InvalidRequest("signing in with NATS credentials needs PyNaCl (`pip install pynacl`)") from None
        return None, None

    def init() -> None:
        if lib.sodium_init() == -1:
            raise RuntimeError("could not initialise libsodium")

    ffi.init_once(init, "libsodium")  # the name PyNaCl's own sodium_init() uses: done once for both
    return ffi, lib
