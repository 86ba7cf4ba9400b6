"""What an `hfai ps` or `hfai status ID` spares in presenting its credentials and reading its
config, and that what it does instead is what it replaced: the credentials file is read once (not
three times: the client, hfai.core.nats, nats-py), the server's nonce is signed without nkeys (whose
import is PyNaCl's whole bindings package) and the signature is the one nkeys makes, and the
config file a local cluster writes is read without tomllib, into what tomllib reads from it.
The whole-process checks run `hfai` as a real process against a real cluster."""

from __future__ import annotations

import base64
import binascii
import json
import os
import subprocess
import sys
import tomllib

import nkeys
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spine_cluster import Cluster, cli_env

from hfai.auth import jwt, nkey
from hfai.core import nats as _nats
from hfai.core.config import Config, dump_toml, load_config, read_simple_toml
from hfai.protocol.errors import Forbidden, InvalidRequest
from hfai.protocol.types import ChainState

# ------------------------------------------------------------------------------ the signature

KINDS = [nkeys.PREFIX_BYTE_USER, nkeys.PREFIX_BYTE_ACCOUNT, nkeys.PREFIX_BYTE_OPERATOR, nkeys.PREFIX_BYTE_SERVER,
         nkeys.PREFIX_BYTE_CLUSTER]


@pytest.mark.parametrize("kind", KINDS)
def test_a_signature_is_the_one_nkeys_makes(kind):
    for size in (0, 1, 22, 64, 1000):
        seed = nkeys.encode_seed(os.urandom(32), kind)
        data = os.urandom(size)
        want = nkeys.from_seed(bytearray(seed)).sign(data)
        assert nkey.sign(seed, data) == want
        assert nkey.sign(seed.decode(), data) == want
        nkeys.from_seed(bytearray(seed)).verify(data, want)


def test_without_the_cffi_module_the_public_bindings_sign_and_without_pynacl_it_says_so(monkeypatch):
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    want = nkeys.from_seed(bytearray(seed)).sign(b"nonce")
    with monkeypatch.context() as m:
        m.setattr(nkey, "_libsodium", lambda: (None, None))  # a PyNaCl that keeps it elsewhere
        assert nkey.sign(seed, b"nonce") == want
    for name in ("nacl", "nacl._sodium"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    with pytest.raises(InvalidRequest, match="needs PyNaCl"):
        nkey.sign(seed, b"nonce")


def _reencode(raw: bytes) -> str:
    return base64.b32encode(raw).decode().rstrip("=")


def test_what_is_no_seed_is_refused():
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode()
    raw = base64.b32decode(seed + "=" * (-len(seed) % 8))
    public = nkeys.from_seed(bytearray(seed.encode())).public_key.decode()
    flipped = bytearray(raw)
    flipped[5] ^= 1  # one bit of the key: the checksum no longer matches
    body = bytes([nkeys.PREFIX_BYTE_SEED | nkeys.PREFIX_BYTE_PRIVATE >> 5, (nkeys.PREFIX_BYTE_PRIVATE & 31) << 3])
    body += raw[2:-2]
    wrong_kind = body + binascii.crc_hqx(body, 0).to_bytes(2, "little")
    for bad, why in [("S!!!", "base32"), (seed[:-8], "bytes"), (_reencode(bytes(flipped)), "checksum"),
                     (public, "wrong prefix|checksum|bytes"), (_reencode(wrong_kind), "wrong prefix")]:
        with pytest.raises(InvalidRequest, match=why):
            nkey.sign(bad, b"nonce")


def test_credentials_with_a_broken_seed_are_refused_before_connecting(tmp_path):
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    token = "e30." + base64.urlsafe_b64encode(json.dumps({"name": "u", "nats": {}}).encode()).decode().rstrip("=")
    path = tmp_path / "u.creds"
    broken = seed[:10] + (b"A" if seed[10:11] != b"A" else b"B") + seed[11:]  # its checksum no longer matches
    path.write_text(jwt.creds_text(token + ".sig", broken))
    with pytest.raises(Forbidden, match="holds no usable user seed"):
        _nats.read_credentials(path)
    path.write_text(jwt.creds_text(token + ".sig", seed))
    creds = _nats.read_credentials(path)
    assert creds.claims["name"] == "u" and creds.user_jwt() == (token + ".sig").encode()
    nonce = "nonce-from-the-server"
    signature = base64.b64decode(creds.sign_nonce(nonce))
    nkeys.from_seed(bytearray(seed)).verify(nonce.encode(), signature)
    with pytest.raises(Forbidden, match="no NATS credentials at"):
        _nats.read_credentials(tmp_path / "absent.creds")


# ----------------------------------------------------------------------------- the config file


def test_a_local_clusters_config_is_read_as_tomllib_reads_it(tmp_path):
    text = dump_toml(Config())
    assert read_simple_toml(text) == tomllib.loads(text)
    path = tmp_path / "hfai.toml"
    path.write_text(text.replace('url = "nats://127.0.0.1:4222"', 'url = "nats://10.0.0.1:4222"'))
    assert load_config(path, env={}).nats.url == "nats://10.0.0.1:4222"


_KEYS = st.one_of(st.sampled_from(["url", "x_y", "k-1", "1", "-", "_", "é", "a b", '"q"', "a.b"]),
                  st.text("abcdefgh_-0123", min_size=1, max_size=6))
_ODD = st.sampled_from([
    "01", "+1", "-0", "1.", ".5", "1e5", "1E-05", "1_000", "0x10", "true", "'lit'", '"a\\tb"', "[1]", "1979-05-27",
    "-0.0", "+inf", "nan", '"a" # c', "1 2", "1e", "1e+", "1.5e-3", "00.5", "1.e5", "-1E5", "+0", "\u0663", "\u00b2",
    "1.5\u00b2", '"\t"', '"\u00e9\u2028"', '"\\"', '"', '""', '"a""b"', "1e1e1", "1.2.3", "--1", "+-1", "0.0e0",
    "9" * 400 + ".0", "1" * 5000, "1 # c", "{}", '"\x7f"', '"\x85"', "1\x0c"])
_VALUES = st.one_of(
    st.integers(-10**20, 10**20).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats().map(lambda f: f"{f:e}"), st.text(max_size=8).map(lambda t: f'"{t}"'), st.text(max_size=6), _ODD)
_KEY_LINES = st.tuples(st.sampled_from(["", " ", "\t"]), _KEYS, st.sampled_from([" = ", "=", " =\t", " . ", " "]),
                       _VALUES, st.sampled_from(["", " ", "\t", "\x0b"])).map("".join)
_LINES = st.one_of(
    _KEY_LINES, _KEY_LINES, _KEY_LINES,
    st.sampled_from(["[nats]", "[agent]", "[nats]", " [web] ", "[a.b]", "[[x]]", "[ nats ]", "[é]", "[]", "# note",
                     "#", "", "  ", "\t", "# c\x01", "# c\t\u00e9", "\r", "x = 1\x0c", "\ufeff"]),
    st.text(max_size=10))
_FILES = st.tuples(st.sampled_from(["[nats]\n", "", "# c\n[dev]\n"]), st.lists(_LINES, max_size=8)).map(
    lambda t: [t[0] + t[1][0], *t[1][1:]] if t[1] else [t[0]])


_GOOD_VALUES = st.one_of(
    st.integers(-10**18, 10**18).map(str), st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(st.characters(whitelist_categories=("L", "N", "P", "S"), whitelist_characters=" ",
                          blacklist_characters='"\\'), max_size=12).map(lambda t: f'"{t}"'))
_GOOD_FILES = st.dictionaries(
    st.text("abcxyz_-019", min_size=1, max_size=5),
    st.dictionaries(st.text("abcxyz_-019", min_size=1, max_size=5), _GOOD_VALUES, max_size=6), max_size=4)


@settings(max_examples=300, deadline=None)
@given(_GOOD_FILES, st.sampled_from(["\n", "\r\n"]), st.sampled_from([" = ", "=", " =\t"]))
def test_a_file_as_dump_toml_writes_it_is_read_without_tomllib(tables, newline, equals):
    lines = []
    for name, table in tables.items():
        lines += [f"[{name}]", *(f"{key}{equals}{value}" for key, value in table.items()), ""]
    text = newline.join(lines)
    assert read_simple_toml(text) == tomllib.loads(text)


@settings(max_examples=1500, deadline=None)
@given(_FILES, st.sampled_from(["\n", "\r\n", "\r"]))
def test_a_file_read_without_tomllib_reads_as_tomllib_reads_it(lines, newline):
    text = newline.join(lines)
    try:
        simple = read_simple_toml(text)
    except ValueError:  # an integer of more digits than Python converts: tomllib's error too
        with pytest.raises(ValueError, match="digits"):
            tomllib.loads(text)
        return
    if simple is None:
        return  # left to tomllib, whatever it makes of it
    assert simple == tomllib.loads(text)


# ------------------------------------------------------------------------------- whole processes

#: Run as the `hfai` process: counts each opening of the credentials file (the "open" audit event
#: fires for builtins.open, io.open and os.open alike), and lists the signing modules loaded.
PROBE = """
import json, os, sys
creds = os.path.realpath(sys.argv[1])
opened = []
def audit(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) \\
            and os.path.realpath(os.fsdecode(args[0])) == creds:
        opened.append(args[1])
sys.addaudithook(audit)
from hfai.cli.main import main
try:
    main(sys.argv[2:], standalone_mode=False)
except SystemExit as e:
    assert not e.code, e.code
signing = ("nkeys", "nacl.bindings", "nacl.signing", "tomllib")
print(json.dumps({"opened": len(opened), "loaded": sorted(m for m in signing if m in sys.modules)}))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("creds"), nodes=1) as c:
        c.creds("tester")
        yield c


@pytest.mark.parametrize("args", [("ps", "-a"), ("status", "JOB")])
def test_a_query_reads_its_credentials_once_and_signs_without_nkeys_or_tomllib(cluster, tmp_path, args):
    job = cluster.submit([sys.executable, "-c", "pass"], "creds", workdir=tmp_path)
    cluster.wait_state(job.id, ChainState.SUCCEEDED)
    args = tuple(job.id if a == "JOB" else a for a in args)
    creds = cluster.creds("tester")
    r = subprocess.run([sys.executable, "-c", PROBE, str(creds), *args], env=cli_env(cluster), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert job.id in r.stdout  # it connected, signed in as tester and got its answer
    assert json.loads(r.stdout.splitlines()[-1]) == {"opened": 1, "loaded": []}


def test_a_daemon_presents_its_file_through_nats_py_and_reads_it_again_at_connect(cluster):
    """A daemon's credentials stay a file nats-py reads (at every reconnect: a replaced file
    is presented then), signed by nkeys: the platform extra is installed where daemons run."""
    options = _nats._identity(str(cluster.creds("tester")))
    assert options["user_credentials"] == str(cluster.creds("tester")) and "signature_cb" not in options
