"""The registry: minting, save/load, and every validation error (one line, naming tenant and field)."""

from __future__ import annotations

import copy
import re
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.core import registry as reg
from harness.core.registry import MINTED_KINDS, Registry, RegistryError, is_secret_kind, mint
from harness.core.registry_file import load, parse

NAMES = ["alice", "bob", "carol"]


def minted(tmp_path: Path, names: list[str] = NAMES) -> Registry:
    return mint(names, tmp_path / "work", {n: {"listen": 41000 + i} for i, n in enumerate(names)})


def good_doc() -> dict[str, Any]:
    return {
        "version": 1,
        "tenants": {
            "alice": {
                "key": "sk-alice-000000000001",
                "model": "model-alice-0000001",
                "route": {"listen": 41001},
                "canaries": {"memory": "memory-alice-0000001"},
            },
            "bob": {
                "key": "sk-bob-0000000000002",
                "model": "model-bob-00000002",
                "route": {"host": "bob.provider.test"},
                "canaries": {"memory": "memory-bob-00000002"},
            },
        },
    }


def error_of(doc: Any) -> str:
    text = doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False)
    with pytest.raises(RegistryError) as exc:
        parse(text)
    message = str(exc.value)
    assert "\n" not in message, message
    assert message.startswith("registry: "), message
    return message


# -- minting --------------------------------------------------------------------------------------------------


def test_good_doc_is_valid() -> None:
    """The base document of the error tests is itself valid: each error below comes from its one change."""
    r = parse(yaml.safe_dump(good_doc()))
    assert r.names() == ["alice", "bob"]
    assert r["bob"].host == "bob.provider.test"
    assert r["alice"].listen == 41001


def test_mint_every_kind(tmp_path: Path) -> None:
    r = minted(tmp_path)
    for t in r:
        assert set(t.all_canaries()) == {"key", "model", *MINTED_KINDS}
        assert all(len(v) >= reg.MIN_CANARY_LEN for v in t.all_canaries().values())
        assert t.secrets().keys() == {"key", "api_server_key"}
        assert t.canaries["workdir"].startswith(str(tmp_path / "work"))


def test_mint_tags_have_at_least_40_bits(tmp_path: Path) -> None:
    r = minted(tmp_path)
    for t in r:
        tags = {re.search(r"[0-9a-f]+$", v).group() for v in t.all_canaries().values()}
        assert len(tags) == 1, tags  # one tag per tenant, embedded in every canary
        (tag,) = tags
        assert len(tag) * 4 >= 40
        assert all(tag in v for v in t.all_canaries().values())


def test_mint_values_unique(tmp_path: Path) -> None:
    a, b = minted(tmp_path), minted(tmp_path)
    values = [v for r in (a, b) for t in r for v in t.all_canaries().values()]
    assert len(values) == len(set(values))
    tags = {reg.new_tag() for _ in range(1000)}
    assert len(tags) == 1000


def test_secret_kinds() -> None:
    assert is_secret_kind("key") and is_secret_kind("api_server_key") and is_secret_kind("extra_key")
    assert not is_secret_kind("memory") and not is_secret_kind("model")


def test_add_canary_validates(tmp_path: Path) -> None:
    r = minted(tmp_path)
    r.add_canary("alice", "extra", "extra-canary-alice-1")
    assert r["alice"].all_canaries()["extra"] == "extra-canary-alice-1"
    with pytest.raises(RegistryError, match="tenant 'bob': canary 'dup'"):
        r.add_canary("bob", "dup", "extra-canary-alice-1")
    assert "dup" not in r["bob"].canaries  # rolled back


def test_a_second_canary_of_a_kind_keeps_the_first(tmp_path: Path) -> None:
    """`--scenario all` runs the settings phase twice: the second minted `saved_key` must not replace the
    first (whose leaks would then go unseen), and its numbered kind is still a secret."""
    r = minted(tmp_path)
    r.add_canary("alice", "saved_key", "sk-saved-alice-qxcvyb000000000001")
    with pytest.raises(RegistryError, match="already has a canary 'saved_key'"):
        r.add_canary("alice", "saved_key", "sk-saved-alice-qxcvyb000000000002")
    kind = r.free_kind("alice", "saved_key")
    r.add_canary("alice", kind, "sk-saved-alice-qxcvyb000000000002")
    assert kind == "saved_key_2" and r.free_kind("alice", "saved_key") == "saved_key_3"
    assert r["alice"].canaries["saved_key"] == "sk-saved-alice-qxcvyb000000000001"
    assert {"saved_key", "saved_key_2"} <= set(r["alice"].secrets())
    assert r.free_kind("alice", "workdir_set") == "workdir_set" and not reg.is_secret_kind("workdir_set_2")


# -- save / load ----------------------------------------------------------------------------------------------


def test_save_load_roundtrip_private(tmp_path: Path) -> None:
    r = minted(tmp_path)
    r["alice"].home = str(tmp_path / "homes" / "alice")
    r["bob"].upstream = "http://127.0.0.1:9/v1"
    path = tmp_path / "out" / "registry.yaml"
    r.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    back = load(path)
    assert back.to_dict() == r.to_dict()
    assert back["alice"].home == r["alice"].home
    assert [p.name for p in path.parent.iterdir()] == ["registry.yaml"]  # no temp file left behind


# -- validation errors ----------------------------------------------------------------------------------------


def test_unknown_top_level_field() -> None:
    doc = good_doc() | {"tenant": {}}
    assert error_of(doc) == "registry: unknown top-level field 'tenant'"


def test_unknown_tenant_field() -> None:
    doc = good_doc()
    doc["tenants"]["bob"]["modle"] = "x" * 20
    assert error_of(doc) == "registry: tenant 'bob': unknown field 'modle'"


@pytest.mark.parametrize("missing", ["key", "model", "route"])
def test_missing_field(missing: str) -> None:
    doc = good_doc()
    del doc["tenants"]["alice"][missing]
    assert error_of(doc) == f"registry: tenant 'alice': missing field '{missing}'"


def test_shared_value() -> None:
    doc = good_doc()
    doc["tenants"]["bob"]["canaries"]["soul"] = doc["tenants"]["alice"]["canaries"]["memory"]
    assert error_of(doc) == "registry: tenant 'bob': canary 'soul': same value as tenant 'alice' canary 'memory'"


def test_shared_key() -> None:
    doc = good_doc()
    doc["tenants"]["bob"]["key"] = doc["tenants"]["alice"]["key"]
    assert error_of(doc) == "registry: tenant 'bob': canary 'key': same value as tenant 'alice' canary 'key'"


@pytest.mark.parametrize(("field", "path"), [("key", ("key",)), ("memory", ("canaries", "memory"))])
def test_short_canary(field: str, path: tuple[str, ...]) -> None:
    doc = good_doc()
    target = doc["tenants"]["alice"]
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = "x" * 11
    assert error_of(doc) == f"registry: tenant 'alice': canary '{field}': shorter than 12 characters"


def test_twelve_characters_is_enough() -> None:
    doc = good_doc()
    doc["tenants"]["alice"]["canaries"]["memory"] = "y" * 12
    parse(yaml.safe_dump(doc))


def test_value_contains_other_tenants_value() -> None:
    doc = good_doc()
    doc["tenants"]["bob"]["canaries"]["soul"] = "prefix-" + doc["tenants"]["alice"]["key"] + "-suffix"
    assert error_of(doc) == "registry: tenant 'bob': canary 'soul' contains tenant 'alice' canary 'key'"


def test_value_may_contain_own_value() -> None:
    doc = good_doc()
    doc["tenants"]["alice"]["canaries"]["soul"] = "soul-" + doc["tenants"]["alice"]["key"]
    parse(yaml.safe_dump(doc))


@pytest.mark.parametrize("version", [3, 0, "1", None, True])
def test_wrong_version(version: Any) -> None:
    doc = good_doc() | {"version": version}
    assert error_of(doc) == f"registry: version must be 1 or 2, got {version!r}"


def test_missing_version() -> None:
    doc = good_doc()
    del doc["version"]
    assert error_of(doc) == "registry: version must be 1 or 2, got None"


def test_alias_rejected() -> None:
    text = yaml.safe_dump(good_doc(), sort_keys=False).replace(
        "route:\n      listen: 41001", "route: &r\n      listen: 41001", 1
    )
    text = text.replace("route:\n      host: bob.provider.test", "route: *r", 1)
    assert "*r" in text and "&r" in text
    assert re.fullmatch(r"registry: YAML aliases are not allowed \(line \d+\)", error_of(text))


def test_alias_bomb_rejected() -> None:
    rows = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        rows.append(f"{name}: &{name} [{','.join(['*' + prev] * 9)}]")
    message = error_of("\n".join(rows) + "\n")
    assert message == "registry: YAML aliases are not allowed (line 2)"


@pytest.mark.parametrize("text", ["version: 1\ntenants: {alice: [\n", "a: b: c\n", "\tversion: 1\n"])
def test_not_yaml(text: str) -> None:
    assert re.fullmatch(r"registry: not valid YAML at line \d+", error_of(text))


@pytest.mark.parametrize("text", ["- 1\n- 2\n", "just a string\n", "", "42\n"])
def test_not_a_mapping(text: str) -> None:
    assert error_of(text) == "registry: top level must be a mapping with 'version' and 'tenants'"


@pytest.mark.parametrize("tenants", [None, {}, [], "alice"])
def test_tenants_not_a_mapping(tenants: Any) -> None:
    assert error_of({"version": 1, "tenants": tenants}) == "registry: 'tenants' must be a non-empty mapping"


def test_tenant_not_a_mapping() -> None:
    doc = good_doc()
    doc["tenants"]["bob"] = "sk-bob"
    assert error_of(doc) == "registry: tenant 'bob': must be a mapping"


ROUTE_FORMS = ("{listen: PORT}, {host: HOSTNAME} or {host: HOSTNAME, by: credential | [KIND, ...]}")


@pytest.mark.parametrize("route", [
    {"listen": "41001"}, {}, {"listen": 1, "host": "h"}, "41001", {"port": 1},
    {"host": "slack.com", "by": "token"}, {"host": "slack.com", "by": []}, {"host": "slack.com", "by": ["Bad Kind"]},
    {"host": "", "by": "credential"}, {"listen": 1, "by": "credential"}, {"host": "h", "by": "credential", "x": 1},
])
def test_bad_route(route: Any) -> None:
    doc = good_doc()
    doc["tenants"]["alice"]["route"] = route
    assert error_of(doc) == f"registry: tenant 'alice': field 'route' must be {ROUTE_FORMS}"


def shared_doc() -> dict[str, Any]:
    """alice and bob both reach their `chat` service at chat.example by the credential they carry; carol's
    gateway has a host of its own."""
    doc = good_doc()
    doc["tenants"]["carol"] = {"key": "sk-carol-00000000003", "model": "model-carol-0000003",
                               "route": {"listen": 41003}, "canaries": {"chat_key": "chatkey-carol-0000003"},
                               "services": {"chat": {"route": {"host": "gateway.carol.chat.test"},
                                                     "credential": "chat_key"}}}
    for name in ("alice", "bob"):
        doc["tenants"][name]["canaries"] |= {"chat_key": f"chatkey-{name}-000000{len(name)}",
                                             "chat_app": f"chatapp-{name}-000000{len(name)}"}
        doc["tenants"][name]["services"] = {"chat": {"route": {"host": "chat.example", "by": "credential"},
                                                     "upstream": f"http://127.0.0.1:4200{len(name)}",
                                                     "credential": "chat_key"}}
    return doc


def test_a_host_shared_by_credential_is_valid_and_no_single_tenants() -> None:
    r = parse(yaml.safe_dump(shared_doc()))
    assert r.endpoint(host="chat.example") is None  # no tenant's by itself
    assert [(t.name, s, kinds) for t, s, kinds in r.sharing("CHAT.example.")] == [
        ("alice", "chat", ("chat_key",)), ("bob", "chat", ("chat_key",))]
    assert r.endpoint(host="gateway.carol.chat.test") == (r["carol"], "chat")  # a tenant's own host, by host
    doc = shared_doc()
    doc["tenants"]["bob"]["services"]["chat"]["route"]["by"] = ["chat_key", "chat_app"]  # several tokens
    assert [kinds for _, _, kinds in parse(yaml.safe_dump(doc)).sharing("chat.example")] == [
        ("chat_key",), ("chat_key", "chat_app")]


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["tenants"]["bob"]["services"]["chat"]["route"].pop("by"),
     "registry: two tenants or services share the host 'chat.example' (a shared host needs `by` on every route)"),
    (lambda d: d["tenants"]["bob"].update(services={"mail": d["tenants"]["bob"]["services"]["chat"]}),
     "registry: host 'chat.example' is shared by two services (a shared host is one's)"),
    (lambda d: d["tenants"]["bob"]["services"]["chat"]["route"].update(by=["chat_token"]),
     "registry: tenant 'bob': service 'chat': route by ['chat_token'] names no canary the tenant has "
     "('chat_token')"),
    (lambda d: d["tenants"]["bob"]["services"]["chat"].pop("credential"),
     "registry: tenant 'bob': service 'chat': route by 'credential' names no canary the tenant has"),
    (lambda d: d["tenants"]["bob"].update(route={"host": "chat.example", "by": "credential"}),
     "registry: host 'chat.example' is shared by two services (a shared host is one's)"),
])
def test_a_malformed_shared_host_is_one_line(change: Any, message: str) -> None:
    doc = shared_doc()
    change(doc)
    assert error_of(doc) == message


def test_canaries_not_a_mapping() -> None:
    doc = good_doc()
    doc["tenants"]["alice"]["canaries"] = ["memory-alice-0000001"]
    assert error_of(doc) == "registry: tenant 'alice': field 'canaries' must be a mapping"


@pytest.mark.parametrize("kind", ["key", "model"])
def test_reserved_canary_name(kind: str) -> None:
    doc = good_doc()
    doc["tenants"]["alice"]["canaries"][kind] = "reserved-canary-0001"
    assert error_of(doc) == f"registry: tenant 'alice': canary '{kind}' is a reserved name (it is a tenant field)"


@pytest.mark.parametrize("fld", ["home", "upstream"])
def test_non_string_field(fld: str) -> None:
    doc = good_doc()
    doc["tenants"]["alice"][fld] = 42
    assert error_of(doc) == f"registry: tenant 'alice': field '{fld}' must be a string"


def test_non_string_canary() -> None:
    doc = good_doc()
    doc["tenants"]["alice"]["model"] = 123456789012345
    assert error_of(doc) == "registry: tenant 'alice': canary 'model': value must be a string"


def test_bad_kind_name() -> None:
    doc = good_doc()
    doc["tenants"]["alice"]["canaries"]["Bad-Kind"] = "bad-kind-canary-0001"
    assert error_of(doc) == "registry: tenant 'alice': canary 'Bad-Kind': kind name is not a lowercase identifier"


def test_bad_tenant_name() -> None:
    doc = good_doc()
    doc["tenants"]["Alice Smith"] = doc["tenants"].pop("alice")
    assert error_of(doc) == "registry: tenant name 'Alice Smith' is not a short lowercase identifier"


def test_long_canary() -> None:
    doc = good_doc()
    doc["tenants"]["alice"]["canaries"]["memory"] = "m" * (reg.MAX_CANARY_LEN + 1)
    assert error_of(doc) == f"registry: tenant 'alice': canary 'memory': longer than {reg.MAX_CANARY_LEN} characters"


def test_shared_listen_port() -> None:
    doc = good_doc()
    doc["tenants"]["bob"]["route"] = copy.deepcopy(doc["tenants"]["alice"]["route"])
    assert error_of(doc) == "registry: two tenants or services share a listen port"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "version: 1\ntenants:\n  alice: {key: sk-alice-000000000001, model: model-alice-0000001,"
            " route: {listen: 1}}\n  alice: {key: sk-alice-000000000009, model: model-alice-0000009,"
            " route: {listen: 2}}\n",
            "registry: duplicate key 'alice' (line 4)",
        ),
        (
            "version: 1\ntenants:\n  alice:\n    key: sk-alice-000000000001\n    key: sk-alice-000000000002\n"
            "    model: model-alice-0000001\n    route: {listen: 1}\n",
            "registry: duplicate key 'key' (line 5)",
        ),
    ],
)
def test_duplicate_keys(text: str, message: str) -> None:
    """YAML would silently keep the last of two equal keys: a tenant or a key would vanish unnoticed."""
    assert error_of(text) == message


# -- load: file-level errors ----------------------------------------------------------------------------------


def test_load_missing(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match=r"^registry: .*nope\.yaml does not exist$"):
        load(tmp_path / "nope.yaml")


def test_load_huge(tmp_path: Path) -> None:
    path = tmp_path / "registry.yaml"
    path.write_bytes(b"#" * (reg.MAX_REGISTRY_BYTES + 1))
    with pytest.raises(RegistryError) as exc:
        load(path)
    size, limit = reg.MAX_REGISTRY_BYTES + 1, reg.MAX_REGISTRY_BYTES
    assert str(exc.value) == f"registry: {path} is {size} bytes, more than {limit}"


def test_load_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "registry.yaml"
    path.write_bytes(yaml.safe_dump(good_doc()).encode() + b"# \xff\xfe latin-1 \xe9\n")
    with pytest.raises(RegistryError) as exc:
        load(path)
    assert str(exc.value) == f"registry: {path} is not UTF-8 text"


def test_load_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "registry.yaml"
    path.mkdir()  # a directory cannot be read as a file, even by root
    with pytest.raises(RegistryError, match=r"^registry: cannot read .*registry\.yaml: "):
        load(path)


def test_load_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(yaml.safe_dump(good_doc()))
    assert load(path).names() == ["alice", "bob"]


def test_a_registry_survives_pickling_with_a_lock_of_its_own(tmp_path: Path) -> None:
    import pickle

    before = minted(tmp_path)
    before.derive("alice", "reply", "bob")
    after = pickle.loads(pickle.dumps(before))
    assert after == before and after.lock is not before.lock
    with after.lock:  # a usable lock, and the derived canaries' provenance came along
        assert after["alice"].derived == before["alice"].derived
