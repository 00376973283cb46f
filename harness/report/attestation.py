"""The manifest of an evidence folder (`manifest.intoto.json`): an in-toto Statement v1 whose subjects are every
other file of the folder with its SHA-256, and whose predicate is what the audit concluded (verdict, incidents,
fingerprints, coverage) and what it ran (tenancy-audit, mitmproxy, Hermes and its lock); signed in a DSSE envelope
when a key is given, else the bare Statement, which says it is unsigned. Written last, after `seal` (0600); read
back by `verify`, which checks every file and the signature here and the predicate against a new reconciliation
(`unreproduced`). docs/contracts.md has the format.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from harness.core import dsse
from harness.core.digests import Digest, ManifestError, differences, folder_digests
from harness.core.files import MANIFEST, RECORD, REGISTRY, write_private
from harness.core.findings import Finding
from harness.report.result import AuditResult

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
#: The predicate's type: this project's evidence manifest, version 1 (docs/contracts.md#manifest).
PREDICATE_TYPE = "urn:tenancy-audit:evidence-manifest:v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
#: What `verify` reconciles again and compares.
REPRODUCED = ("verdict", "incidents", "fingerprints")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _fingerprints(found: list[Finding]) -> list[str]:
    return sorted({f.fingerprint() for f in found})


def predicate(result: AuditResult, lock: dict[str, Any] | None, key: Ed25519PrivateKey | None,
              reports_of: Path | None = None) -> dict[str, Any]:
    """What the folder's audit concluded and ran. `lock`: the Hermes lock (file and sha256) its venv came from;
    `reports_of`: the evidence folder whose reports these are (`reconcile --out`; None: the folder is the evidence)."""
    v = result.verdict
    return {
        "verdict": v.status, "exit_code": v.exit_code, "scenario": result.scenario,
        "incidents": [{"id": r.incident.id, "entry": r.incident.entry, "documented": r.documented, "new": r.new,
                       "allowed": r.allowed} for r in result.incidents],
        "fingerprints": {"findings": _fingerprints(v.findings), "known": _fingerprints(v.known),
                         "allowed": _fingerprints(v.allowed)},
        "coverage": {"tools": result.coverage, "services": result.services, "doors": result.doors},
        "versions": {name: result.versions.get(name) for name in ("tenancy-audit", "mitmproxy", "hermes-agent")},
        "lock": {"file": lock.get("file"), "sha256": lock.get("sha256")} if lock else None,
        "signature": ({"signed": True, "algorithm": "ed25519", "keyid": dsse.keyid(key.public_key())} if key
                      else {"signed": False}),
        "folder": "evidence" if reports_of is None else "reports",
        **({"reports_of": str(reports_of)} if reports_of is not None else {}),
    }


def subject(name: str, digest: Digest) -> dict[str, Any]:
    """An in-toto ResourceDescriptor: the file's path in the folder and its SHA-256 (its kind when not a file)."""
    kind = {} if digest.kind == "file" else {"annotations": {"kind": digest.kind}}
    return {"name": name, "digest": {"sha256": digest.sha256}, **kind}


def write_manifest(folder: Path, result: AuditResult, lock: dict[str, Any] | None, key: Ed25519PrivateKey | None,
                   reports_of: Path | None = None) -> Path:
    """Write the folder's manifest (last: every other file is its subject), 0600; signed with `key` when given."""
    statement = {"_type": STATEMENT_TYPE,
                 "subject": [subject(n, d) for n, d in folder_digests(folder, frozenset({MANIFEST})).items()],
                 "predicateType": PREDICATE_TYPE, "predicate": predicate(result, lock, key, reports_of)}
    if key is None:
        data = json.dumps(statement, indent=1)
    else:
        data = json.dumps(dsse.sign(json.dumps(statement).encode(), PAYLOAD_TYPE, key), indent=1)
    write_private(folder / MANIFEST, (data + "\n").encode())
    return folder / MANIFEST


@dataclass
class Recorded:
    """A manifest read back: its predicate, its subjects' digests, how it is signed, and what is wrong with it
    (each a line; a bad signature is one)."""

    predicate: dict[str, Any]
    digests: dict[str, Digest]
    signature: str  # "unsigned", "good (ed25519 KEYID)", "not checked (signed by KEYID; pass --key)"
    problems: list[str] = field(default_factory=list)

    @property
    def holds_evidence(self) -> bool:
        """The folder is an audit's evidence (reconciled again), not the reports of one."""
        return self.predicate.get("folder") == "evidence" and {REGISTRY, RECORD} <= self.digests.keys()


def _malformed(why: str) -> ManifestError:
    return ManifestError(f"verify: {MANIFEST} is malformed: {why}")


def _digests(statement: dict[str, Any]) -> dict[str, Digest]:
    subjects = statement.get("subject")
    if not isinstance(subjects, list):
        raise _malformed("no subject list")
    out: dict[str, Digest] = {}
    for s in subjects:
        name = s.get("name") if isinstance(s, dict) else None
        sha = s.get("digest", {}).get("sha256") if isinstance(s, dict) and isinstance(s.get("digest"), dict) else None
        kind = (s.get("annotations") or {}).get("kind", "file") if isinstance(s, dict) else None
        if not isinstance(name, str) or not isinstance(sha, str) or not _SHA256.fullmatch(sha) or name in out:
            raise _malformed("a subject without a name and a sha256 digest, or one listed twice")
        out[name] = Digest(sha, str(kind))
    return out


def _statement(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError:
        raise _malformed("not JSON") from None
    if not isinstance(doc, dict):
        raise _malformed("not a JSON object")
    return doc


def read_manifest(folder: Path, key: Ed25519PublicKey | None) -> Recorded:
    """The folder's manifest, its signature checked with `key` when given. ManifestError (exit 2): none, unreadable,
    malformed, signed by another key than `key`, or unsigned when `key` is given; a signature of `key` that does not
    hold is a problem (exit 1: the manifest changed after it was signed)."""
    path = folder / MANIFEST
    try:
        doc = _statement(path.read_bytes())
    except FileNotFoundError:
        raise ManifestError(f"verify: {folder} has no {MANIFEST} (nothing to verify the files against)") from None
    except OSError as exc:
        raise ManifestError(f"verify: cannot read {MANIFEST}: {exc.strerror or exc}") from None
    problems: list[str] = []
    if "payloadType" in doc:
        envelope = dsse.parse(doc, MANIFEST)
        if envelope.payload_type != PAYLOAD_TYPE:
            raise _malformed(f"payloadType {envelope.payload_type!r}, not {PAYLOAD_TYPE}")
        signers = [kid for kid, _ in envelope.signatures]
        statement = _statement(envelope.payload)
        if key is None:
            signature = f"not checked (signed by {signers[0][:16]}; pass --key)"
        elif dsse.keyid(key) not in signers:
            raise ManifestError(f"verify: {MANIFEST} is signed by key {signers[0][:16]}, not by --key "
                                f"({dsse.keyid(key)[:16]})")
        elif envelope.verifies(key):
            signature = f"good (ed25519 {dsse.keyid(key)[:16]})"
        else:
            signature = "bad"
            problems.append(f"changed: {MANIFEST} (its signature does not hold: it changed after it was signed)")
    else:
        if key is not None:
            raise ManifestError(f"verify: {MANIFEST} is unsigned: --key has no signature to check")
        statement, signers, signature = doc, [], "unsigned"
    return Recorded(_predicate(statement, signers, problems), _digests(statement), signature, problems)


def _predicate(statement: dict[str, Any], signers: list[str], problems: list[str]) -> dict[str, Any]:
    """The statement's predicate, checked for its type and the fields `verify` compares; a signing claim that
    does not match the envelope is a problem."""
    if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != PREDICATE_TYPE:
        raise _malformed(f"not an in-toto Statement of {PREDICATE_TYPE}")
    pred = statement.get("predicate")
    if not (isinstance(pred, dict) and isinstance(pred.get("verdict"), str) and isinstance(pred.get("incidents"), list)
            and isinstance(pred.get("fingerprints"), dict) and isinstance(pred.get("signature"), dict)
            and isinstance(pred.get("folder"), str)):
        raise _malformed("its predicate lacks a verdict, incidents, fingerprints, signature or folder")
    claimed = pred["signature"].get("keyid")
    if claimed not in (signers[:1] or [None]):
        problems.append(f"changed: {MANIFEST} (its statement names signing key {str(claimed)[:16]}, its envelope "
                        f"{(signers[:1] or ['none'])[0][:16]})")
    return pred


def unreproduced(recorded: dict[str, Any], result: AuditResult) -> list[str]:
    """One line per part of the recorded verdict, incidents and fingerprints a new reconciliation does not give."""
    now = predicate(result, None, None)
    lines = []
    if recorded["verdict"] != now["verdict"]:
        lines.append(f"verdict: recorded {recorded['verdict']}, reconciled {now['verdict']}")
    if recorded["incidents"] != now["incidents"]:
        was = {i.get("id") for i in recorded["incidents"] if isinstance(i, dict)}
        got = {i["id"] for i in now["incidents"]}
        lines.append(f"incidents: {len(recorded['incidents'])} recorded, {len(now['incidents'])} reconciled "
                     f"({len(was - got)} gone, {len(got - was)} new, the rest differ in entry, link or state)")
    for role, got_fps in now["fingerprints"].items():
        was_fps = {fp for fp in recorded["fingerprints"].get(role) or [] if isinstance(fp, str)}
        if was_fps != set(got_fps):
            lines.append(f"fingerprints of {role}: {len(was_fps - set(got_fps))} recorded and not reconciled, "
                         f"{len(set(got_fps) - was_fps)} reconciled and not recorded")
    return lines


@dataclass
class Verification:
    """`verify`'s outcome: what failed (one line each: a file, the signature, the verdict, incidents or
    fingerprints; none: verified), how the manifest is signed, how many files it lists, what it recorded, and
    whether the folder was reconciled again (an evidence folder, not the reports of one)."""

    problems: list[str]
    signature: str
    files: int
    recorded: dict[str, Any]
    reconciled: bool


def verify_folder(folder: Path, key: Ed25519PublicKey | None, reconcile: Callable[[Path], AuditResult]
                  ) -> Verification:
    """Every file of `folder` against its manifest (one changed, added or missing file: a problem naming it) and
    the manifest's signature (`key`); then, when all of them hold and the folder is an audit's evidence, the
    folder reconciled again (`reconcile`, which writes nothing into it) and its verdict, incidents and fingerprints
    compared with the recorded ones. ManifestError (exit 2): no manifest, a malformed one, a wrong key, an
    unreadable file."""
    recorded = read_manifest(folder, key)
    problems = recorded.problems + differences(recorded.digests, folder_digests(folder, frozenset({MANIFEST})))
    again = recorded.holds_evidence and not problems
    if again:
        problems = unreproduced(recorded.predicate, reconcile(folder))
    return Verification(problems, recorded.signature, len(recorded.digests), recorded.predicate, again)
