"""`tenancy-audit verify`: an evidence folder against its manifest (every file's SHA-256, the ed25519 signature) and
reconciled again to the recorded verdict, incidents and fingerprints. One changed byte in any file is exit 1 naming
the file; a missing or malformed manifest, a wrong key or an unreadable file is exit 2 and one line; nothing is
ever written into the folder."""

from __future__ import annotations

import base64
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness import cli
from harness.core import digests, dsse
from harness.core.evidence import EvidenceFolder
from harness.core.files import MANIFEST
from harness.core.record import RunRecord
from harness.report.attestation import PREDICATE_TYPE, STATEMENT_TYPE, write_manifest
from harness.report.writer import write_reports
from harness.usecases import ReconcileOptions, reconcile_saved

RECORDED = Path(__file__).resolve().parent / "data" / "scenarios" / "oneshot.tar.xz"
REPORTS = ("findings.json", "report.md", "report.html", "junit.xml", "findings.sarif")


def keypair(where: Path, name: str) -> tuple[Path, Path]:
    """An ed25519 key as `openssl genpkey` and `openssl pkey -pubout` write it: (private PEM, public PEM)."""
    key = Ed25519PrivateKey.generate()
    private, public = where / f"{name}.pem", where / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    (tmp_path / "keys").mkdir()
    return {name: keypair(tmp_path / "keys", name) for name in ("signer", "other")}


def fresh(tmp_path: Path, key: Path | None) -> Path:
    """An evidence folder as `run` leaves it: a real audit's evidence (the recorded one-shot run), its reports,
    sealed, then its manifest, written last as `run_audit` writes it (signed with `key` when given)."""
    with tarfile.open(RECORDED) as archive:
        archive.extractall(tmp_path / "ev", filter="data")
    folder = tmp_path / "ev" / "oneshot"
    result = reconcile_saved(ReconcileOptions(evidence=folder), lambda _: None)
    write_reports(folder, result)
    EvidenceFolder(folder).seal()
    write_manifest(folder, result, RunRecord.read(folder).hermes_venv.get("lock"),
                   dsse.signing_key(key) if key else None)
    return folder


@pytest.fixture
def signed(tmp_path: Path, keys: dict[str, tuple[Path, Path]]) -> Path:
    return fresh(tmp_path, keys["signer"][0])


def state(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry of the folder with its mtime, size and mode: what `verify` must leave as it was."""
    return {str(p.relative_to(folder)): (p.lstat().st_mtime_ns, p.lstat().st_size, p.lstat().st_mode)
            for p in [folder, *folder.rglob("*")]}


def verify(capsys: pytest.CaptureFixture[str], folder: Path, *args: str) -> tuple[int, list[str], list[str]]:
    """`tenancy-audit verify FOLDER ARGS` in-process: (exit code, stdout lines, stderr lines)."""
    code = cli.main(["verify", str(folder), *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def files_of(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


# --- a folder that verifies -------------------------------------------------------------------------------------------


def test_a_fresh_folder_verifies_with_its_key_and_nothing_is_written_into_it(signed, keys, capsys):
    before = state(signed)
    code, out, err = verify(capsys, signed, "--key", str(keys["signer"][1]))
    assert (code, err) == (0, []) and len(out) == 1
    assert out[0].startswith(f"verify: {signed} verified: {len(files_of(signed))} file(s) as recorded, signature good "
                             "(ed25519 ") and "verdict leak, 4 incident(s) and the fingerprints reproduced" in out[0]
    code, out, _ = verify(capsys, signed)  # without the key: the files and the verdict, the signature not checked
    assert code == 0 and "signature not checked (signed by " in out[0]
    assert state(signed) == before


def test_the_manifest_is_written_last_and_lists_every_other_file(signed):
    envelope = json.loads((signed / MANIFEST).read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert envelope["payloadType"] == "application/vnd.in-toto+json" and len(envelope["signatures"]) == 1
    assert statement["_type"] == STATEMENT_TYPE and statement["predicateType"] == PREDICATE_TYPE
    assert [s["name"] for s in statement["subject"]] == files_of(signed)
    assert set(REPORTS) <= {s["name"] for s in statement["subject"]}
    predicate = statement["predicate"]
    assert predicate["signature"]["signed"] and predicate["signature"]["keyid"] == envelope["signatures"][0]["keyid"]
    assert predicate["versions"]["tenancy-audit"] and predicate["versions"]["mitmproxy"]
    assert predicate["versions"]["hermes-agent"] == "0.19.0" and len(predicate["lock"]["sha256"]) == 64
    assert predicate["verdict"] == "leak" and predicate["fingerprints"]["findings"] and predicate["coverage"]["tools"]
    assert (signed / MANIFEST).stat().st_mode & 0o777 == 0o600
    assert (signed / MANIFEST).stat().st_mtime_ns >= max(p.stat().st_mtime_ns for p in signed.rglob("*"))


def test_an_unsigned_manifest_says_so(tmp_path, capsys):
    folder = fresh(tmp_path, None)
    statement = json.loads((folder / MANIFEST).read_text())
    assert statement["predicate"]["signature"] == {"signed": False}
    code, out, _ = verify(capsys, folder)
    assert code == 0 and "signature unsigned" in out[0]


# --- one changed byte anywhere: exit 1 naming the file ----------------------------------------------------------------


def test_one_changed_byte_in_any_file_fails_naming_that_file(signed, keys, capsys):
    names = files_of(signed)
    assert len(names) > 60 and set(REPORTS) <= set(names)
    for name in names:
        path = signed / name
        data = path.read_bytes()
        changed = bytearray(data or b"\0")
        changed[len(changed) // 2] ^= 0x01
        path.write_bytes(bytes(changed))
        try:
            code, out, err = verify(capsys, signed, "--key", str(keys["signer"][1]))
        finally:
            path.write_bytes(data)
        assert (code, err, out[0]) == (1, [], f"changed: {name}"), name
        assert out[-1].startswith(f"verify: {signed} does NOT verify (1 problem(s)"), name
    assert verify(capsys, signed, "--key", str(keys["signer"][1]))[0] == 0


def test_an_added_or_removed_file_fails_naming_it(signed, capsys):
    (signed / "logs" / "extra.log").write_text("x")
    code, out, _ = verify(capsys, signed)
    assert code == 1 and out[0] == "added: logs/extra.log"
    (signed / "logs" / "extra.log").unlink()
    (signed / "report.md").unlink()
    code, out, _ = verify(capsys, signed)
    assert code == 1 and out[0] == "missing: report.md"


def test_a_signed_manifest_changed_after_signing_fails(signed, keys, capsys):
    """A digest rewritten to match an edited file breaks the signature; a manifest stripped of its envelope is
    unsigned although its statement names the signing key."""
    path = signed / MANIFEST
    envelope = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    (signed / "report.md").write_text("edited")
    statement["subject"] = [{**s, "digest": {"sha256": digests.folder_digests(signed)["report.md"].sha256}}
                            if s["name"] == "report.md" else s for s in statement["subject"]]
    path.write_text(json.dumps({**envelope, "payload": base64.b64encode(json.dumps(statement).encode()).decode()}))
    code, out, _ = verify(capsys, signed, "--key", str(keys["signer"][1]))
    assert code == 1 and out[0] == f"changed: {MANIFEST} (its signature does not hold: it changed after it was signed)"
    path.write_text(json.dumps(statement))
    code, out, _ = verify(capsys, signed)
    assert code == 1 and out[0].startswith(f"changed: {MANIFEST} (its statement names signing key ")


def test_a_recorded_verdict_the_folder_does_not_reproduce_fails(tmp_path, capsys):
    folder = fresh(tmp_path, None)
    path = folder / MANIFEST
    statement = json.loads(path.read_text())
    statement["predicate"]["verdict"] = "clean"
    statement["predicate"]["incidents"] = statement["predicate"]["incidents"][1:]
    statement["predicate"]["fingerprints"]["findings"] = statement["predicate"]["fingerprints"]["findings"][2:]
    path.write_text(json.dumps(statement))
    code, out, _ = verify(capsys, folder)
    assert code == 1 and out[:3] == [
        "verdict: recorded clean, reconciled leak",
        "incidents: 3 recorded, 4 reconciled (0 gone, 1 new, the rest differ in entry, link or state)",
        "fingerprints of findings: 0 recorded and not reconciled, 2 reconciled and not recorded"]


# --- bad input: exit 2 and one line, nothing written ---------------------------------------------------------------


def _rewrite(text: str) -> Callable[[Path], None]:
    return lambda folder: (folder / MANIFEST).write_text(text)


def _unsubjected(folder: Path) -> None:
    statement = json.loads((folder / MANIFEST).read_text())
    statement["subject"][0] = {"name": statement["subject"][0]["name"]}
    (folder / MANIFEST).write_text(json.dumps(statement))


BAD = {
    "no manifest": (lambda folder: (folder / MANIFEST).unlink(), [], "has no manifest.intoto.json"),
    "not JSON": (_rewrite("{not json"), [], "manifest.intoto.json is malformed: not JSON"),
    "not a statement": (_rewrite('{"_type": "something else"}'), [], "not an in-toto Statement"),
    "a subject without a digest": (_unsubjected, [], "a subject without a name and a sha256 digest"),
    "not an envelope": (_rewrite('{"payloadType": "x", "payload": 1}'), [], "is not a DSSE envelope"),
    "a key for an unsigned manifest": (lambda folder: None, ["--key", "signer.pub"], "is unsigned"),
    "a key file that is no key": (lambda folder: None, ["--key", "signer.pem"], "is not a PEM public key"),
    "a key file that is missing": (lambda folder: None, ["--key", "gone.pub"], "No such file or directory"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_is_exit_2_with_one_line_and_nothing_written(case, tmp_path, keys, capsys):
    folder = fresh(tmp_path, None)
    spoil, args, message = BAD[case]
    spoil(folder)
    before = state(folder)
    code, out, err = verify(capsys, folder, *[str(tmp_path / "keys" / a) if a.endswith((".pub", ".pem")) else a
                                              for a in args])
    assert (code, out, len(err)) == (2, [], 1) and message in err[0], err
    assert state(folder) == before


def test_a_wrong_key_is_exit_2(signed, keys, capsys):
    before = state(signed)
    code, out, err = verify(capsys, signed, "--key", str(keys["other"][1]))
    assert (code, out) == (2, []) and len(err) == 1 and "is signed by key " in err[0] and "not by --key" in err[0]
    assert state(signed) == before


def test_an_unreadable_file_is_exit_2(signed, monkeypatch, capsys):
    real = digests._open

    def refuse(path: Path):  # the tests run as root, who reads a mode-0000 file
        if path.name == "registry.yaml":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(digests, "_open", refuse)
    code, out, err = verify(capsys, signed)
    assert (code, out, err) == (2, [], ["tenancy-audit: cannot read registry.yaml: Permission denied"])


def test_a_folder_that_is_not_one_is_exit_2(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for target in (tmp_path / "missing", tmp_path / "file"):
        code, out, err = verify(capsys, target)
        assert (code, out, len(err)) == (2, [], 1) and "is not a directory" in err[0]


def test_a_signing_key_that_cannot_sign_is_exit_2_before_anything_is_written(tmp_path, keys, capsys):
    """`reconcile --out --sign-key` with a public key, or with no --out: one line, no folder made."""
    folder = fresh(tmp_path, None)
    out = tmp_path / "reports"
    for args in (["--out", str(out), "--sign-key", str(keys["signer"][1])], ["--sign-key", str(keys["signer"][0])]):
        assert cli.main(["reconcile", str(folder), *args]) == 2
        assert len(capsys.readouterr().err.splitlines()) == 1 and not out.exists()


def test_the_reports_of_reconcile_out_verify_as_reports(tmp_path, keys, capsys):
    folder = fresh(tmp_path, None)
    out = tmp_path / "reports"
    assert cli.main(["reconcile", str(folder), "--out", str(out), "--sign-key", str(keys["signer"][0])]) == 1
    capsys.readouterr()
    assert sorted(os.listdir(out)) == sorted([*REPORTS, MANIFEST])
    code, lines, _ = verify(capsys, out, "--key", str(keys["signer"][1]))
    assert code == 0 and f"the reports of {folder}: verify that evidence folder" in lines[0]
    (out / "junit.xml").write_text("edited")
    assert verify(capsys, out, "--key", str(keys["signer"][1]))[1][0] == "changed: junit.xml"
