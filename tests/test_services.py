"""The service stubs answer what Hermes' own clients call (run in the Hermes venv against the stubs), the
registry records each tenant's services, and the flow inspection and the stdio records check a service's
credential and identity, with a planted leak that must be caught and a near miss that must not."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from harness.capture.stubs.mcp_http import McpHttpStub
from harness.capture.stubs.mcp_stdio import log_name
from harness.capture.stubs.provider import StubProvider
from harness.core.registry import Registry, RegistryError, mint
from harness.core.registry_file import load, parse
from harness.detect import records
from harness.detect.checks import RawRequest
from harness.detect.engine.matcher import matcher_for
from harness.detect.flows import Route, inspect_request
from harness.drive import services
from harness.drive.hermes.agent import hermetic_env
from harness.drive.plants import apply
from harness.drive.services.honcho import HonchoStub, honcho_json, host_key
from harness.drive.services.memory import Mem0Stub
from harness.drive.services.supermemory import SupermemoryStub
from harness.drive.services.web import TavilyStub
from harness.drive.surface import PlantContext

# -- a registry with services ----------------------------------------------------------------------------------


def registry_with_services(tmp_path: Path) -> Registry:
    names = ["default", "alpha"]
    reg = mint(names, tmp_path / "work", {n: {"listen": 42000 + i} for i, n in enumerate(names)})
    services.mint(reg, list(services.SERVICES))
    port = 42100
    for t in reg:
        for name, spec in services.SERVICES.items():
            port += 1
            services.attach(reg, name, t.name, {"listen": port} if spec.proxied else None, f"http://127.0.0.1:{port}")
    return reg


def test_services_round_trip_through_the_registry_file(tmp_path):
    reg = registry_with_services(tmp_path)
    reg.save(tmp_path / "registry.yaml")
    back = load(tmp_path / "registry.yaml")
    assert back.to_dict() == reg.to_dict()
    assert yaml.safe_load((tmp_path / "registry.yaml").read_text())["version"] == 2
    alpha = back["alpha"]
    assert alpha.services["memory"].identity == ("memory_user", "memory_agent")
    assert alpha.credential("memory") == alpha.canaries["memory_key"] and alpha.credential("provider") == alpha.key
    port = alpha.services["web"].listen
    assert back.endpoint(listen_port=port) == (alpha, "web")
    assert back.endpoint(listen_port=alpha.listen) == (alpha, "provider")
    assert alpha.services["mcp_stdio"].route is None  # over stdio: no listener
    assert {s for s in alpha.secrets()} >= {"key", "mcp_key", "mcp_stdio_key", "memory_key", "web_key", "aux_key"}


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update(extra=1), "service 'web': unknown field 'extra'"),
    (lambda s: s.update(credential="nope_key"), "service 'web' names canary 'nope_key', which the tenant does not"),
    (lambda s: s.update(identity="web_key"), "service 'web': field 'identity' must be a list of canary kinds"),
    (lambda s: s.update(route={"listen": 42000}), "two tenants or services share a listen port"),
    (lambda s: s.update(route={"port": 1}), "service 'web': field 'route' must be {listen: PORT}, {host: HOSTNAME} "
                                            "or {host: HOSTNAME, by: credential | [KIND, ...]}"),
])
def test_a_bad_service_is_one_line_naming_it(tmp_path, change, message):
    doc = registry_with_services(tmp_path).to_dict()
    change(doc["tenants"]["alpha"]["services"]["web"])
    with pytest.raises(RegistryError) as exc:
        parse(yaml.safe_dump(doc))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_the_provider_is_no_service_name(tmp_path):
    doc = registry_with_services(tmp_path).to_dict()
    doc["tenants"]["alpha"]["services"]["provider"] = {}
    with pytest.raises(RegistryError, match="service 'provider': name is not a lowercase identifier other than"):
        parse(yaml.safe_dump(doc))


def test_a_version_1_registry_is_still_read(tmp_path):
    doc = registry_with_services(tmp_path).to_dict()
    doc["version"] = 1
    for t in doc["tenants"].values():
        del t["services"]
    assert parse(yaml.safe_dump(doc))["alpha"].services == {}


# -- a service request: credential and identity ---------------------------------------------------------------


def inspect(reg: Registry, service: str, headers: list[tuple[str, str]], body: dict | None, method: str = "POST",
            tenant: str = "alpha"):
    port = reg[tenant].services[service].listen
    data = json.dumps(body).encode() if body is not None else b""
    return inspect_request(reg, matcher_for(reg), Route("reverse", listen_port=port),
                           RawRequest("f1", method, "/x", headers, data))


def kinds(report) -> list[tuple[str, str | None, str | None, str | None]]:
    return sorted((f.kind, f.victim, f.canary, f.service) for f in report.findings)


def test_a_service_request_with_its_own_credential_is_clean(tmp_path):
    reg = registry_with_services(tmp_path)
    a = reg["alpha"]
    report = inspect(reg, "memory", [("X-API-Key", a.canaries["memory_key"])],
                     {"query": "q", "filters": {"user_id": a.canaries["memory_user"]}})
    assert report.findings == [] and report.kind == "service" and report.service == "memory"
    assert report.bearer == "own"


def test_another_tenants_credential_is_wrong_key_at_that_service(tmp_path):
    reg = registry_with_services(tmp_path)
    report = inspect(reg, "memory", [("X-API-Key", reg["default"].canaries["memory_key"])], {"query": "q"})
    assert kinds(report) == [("wrong_key", "default", "memory_key", "memory")]
    assert report.findings[0].location == "flow:f1:request.headers.x-api-key"
    assert report.findings[0].evidence == "x-api-key: <default:memory_key>"


def test_a_credential_in_the_body_counts_once(tmp_path):
    """Tavily takes its key in the JSON body: a foreign one there is wrong_key, not a request_leak besides."""
    reg = registry_with_services(tmp_path)
    report = inspect(reg, "web", [], {"query": "q", "api_key": reg["default"].canaries["web_key"]})
    assert kinds(report) == [("wrong_key", "default", "web_key", "web")]
    assert report.findings[0].location == "flow:f1:request.body.api_key"
    assert report.findings[0].evidence == "api_key: <default:web_key>"


def test_the_tenants_other_secret_is_misused(tmp_path):
    reg = registry_with_services(tmp_path)
    report = inspect(reg, "mcp", [("Authorization", f"Bearer {reg['alpha'].key}")], {"jsonrpc": "2.0"})
    assert kinds(report) == [("wrong_key", "alpha", "key", "mcp")] and report.bearer == "misused"


def test_no_credential_on_a_request_that_does_work_is_wrong_key_but_a_probe_is_not(tmp_path):
    reg = registry_with_services(tmp_path)
    assert kinds(inspect(reg, "aux", [], {"messages": []})) == [("wrong_key", "alpha", "aux_key", "aux")]
    assert inspect(reg, "aux", [], None, method="GET").findings == []


def test_a_near_miss_credential_is_unknown_not_another_tenants(tmp_path):
    reg = registry_with_services(tmp_path)
    near = reg["default"].canaries["memory_key"][:-1] + "x"
    report = inspect(reg, "memory", [("X-API-Key", near)], {"query": "q"})
    assert kinds(report) == [("wrong_key", "alpha", "memory_key", "memory")]
    assert report.findings[0].detail == "unknown bearer" and report.bearer == "unknown"


def test_another_tenants_identity_is_wrong_identity(tmp_path):
    reg = registry_with_services(tmp_path)
    body = {"query": "q", "filters": {"user_id": reg["default"].canaries["memory_user"]}}
    report = inspect(reg, "memory", [("X-API-Key", reg["alpha"].canaries["memory_key"])], body)
    assert kinds(report) == [("wrong_identity", "default", "memory_user", "memory")]


def test_a_near_miss_identity_is_nothing(tmp_path):
    reg = registry_with_services(tmp_path)
    body = {"query": "q", "filters": {"user_id": reg["default"].canaries["memory_user"][:-2]}}
    assert inspect(reg, "memory", [("X-API-Key", reg["alpha"].canaries["memory_key"])], body).findings == []


def test_another_tenants_data_at_a_service_is_a_request_leak_naming_it(tmp_path):
    reg = registry_with_services(tmp_path)
    body = {"jsonrpc": "2.0", "params": {"arguments": {"note": reg["default"].canaries["mcp_note"]}}}
    report = inspect(reg, "mcp", [("Authorization", f"Bearer {reg['alpha'].canaries['mcp_key']}")], body)
    assert kinds(report) == [("request_leak", "default", "mcp_note", "mcp")]


# -- the stdio server's record --------------------------------------------------------------------------------


def write_record(folder: Path, reg: Registry, tenant: str, env: dict[str, str], calls: list[dict]) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / log_name(tenant, 4242)
    lines = [{"time": 1.0, "event": "start", "tenant": tenant, "argv": ["mcp_stdio"], "env": env, "cwd": "/"}]
    lines += [{"time": 2.0, "event": "call", **c} for c in calls]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def found(reg: Registry, folder: Path) -> list[tuple[str, str | None, str | None, str | None, str | None]]:
    out = []
    for record in records.read(folder, reg):
        out += [(f.kind, f.victim, f.canary, f.service, f.tool)
                for _, f in records.check(record, reg, matcher_for(reg))]
    return sorted(out)


def test_a_stdio_server_with_its_own_env_and_calls_is_clean(tmp_path):
    reg = registry_with_services(tmp_path)
    a = reg["alpha"]
    write_record(tmp_path / "services", reg, "alpha", {"TENANCY_MCP_STDIO_KEY": a.canaries["mcp_stdio_key"]},
                 [{"tool": "remember", "arguments": {"note": a.canaries["mcp_note"]}, "result": "{}"}])
    assert found(reg, tmp_path / "services") == []


def test_a_stdio_server_with_another_tenants_credential_env_and_calls(tmp_path):
    reg = registry_with_services(tmp_path)
    d = reg["default"]
    write_record(tmp_path / "services", reg, "alpha",
                 {"TENANCY_MCP_STDIO_KEY": d.canaries["mcp_stdio_key"], "MARK": d.canaries["env_marker"]},
                 [{"tool": "remember", "arguments": {"note": d.canaries["mcp_note"]}, "result": "{}"},
                  {"tool": "recall", "arguments": {}, "result": json.dumps({"record": d.canaries["memory"]})}])
    assert found(reg, tmp_path / "services") == [
        ("env_leak", "default", "env_marker", "mcp_stdio", None),
        ("request_leak", "default", "mcp_note", "mcp_stdio", "mcp__tenancy_stdio__remember"),
        ("response_leak", "default", "memory", "mcp_stdio", "mcp__tenancy_stdio__recall"),
        ("wrong_key", "default", "mcp_stdio_key", "mcp_stdio", None),
    ]


def test_a_stdio_server_without_its_credential_or_a_near_miss(tmp_path):
    reg = registry_with_services(tmp_path)
    near = reg["default"].canaries["env_marker"][:-1]
    write_record(tmp_path / "services", reg, "alpha", {"MARK": near}, [])
    assert found(reg, tmp_path / "services") == [("wrong_key", "alpha", "mcp_stdio_key", "mcp_stdio", None)]


# -- the stubs answer Hermes' own clients ----------------------------------------------------------------------


def run_in_hermes(hermes_python: Path, tmp_path: Path, code: str, env: dict[str, str] | None = None) -> dict:
    """Run `code` in the Hermes venv (its own client libraries); it prints one JSON line."""
    home = tmp_path / "home"
    (home / ".hermes").mkdir(parents=True, exist_ok=True)
    done = subprocess.run([str(hermes_python), "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env=hermetic_env(home, hermes_python, env), cwd=home)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_mem0_stub_answers_hermes_self_hosted_client(tmp_path, hermes_python):
    reg = registry_with_services(tmp_path)
    a = reg["alpha"]
    stub = Mem0Stub(a).start()
    try:
        got = run_in_hermes(hermes_python, tmp_path, f"""
            import json
            from plugins.memory.mem0._backend import SelfHostedBackend
            b = SelfHostedBackend({a.canaries['memory_key']!r}, {stub.url!r})
            added = b.add([{{"role": "user", "content": "note one"}}], user_id="u", agent_id="g")
            found = b.search("note", filters={{"user_id": "u"}})
            mid = found[-1]["id"]
            b.update(mid, "note two")
            again = b.search("note", filters={{"user_id": "u"}})
            b.delete(mid)
            print(json.dumps({{"added": added, "found": found, "again": again, "left": b.search("x", filters={{}})}}))
        """)
    finally:
        stub.stop()
    assert a.canaries["memory_record"] in got["found"][0]["memory"]
    assert [m["memory"] for m in got["found"][1:]] == ["note one"] and got["again"][1]["memory"] == "note two"
    assert len(got["left"]) == 1  # the record only
    one = f"/memories/{got['found'][1]['id']}"
    assert [r.path for r in stub.snapshot()] == ["/memories", "/search", one, "/search", one, "/search"]
    assert not any(r.wrong_key for r in stub.snapshot())


def test_the_supermemory_stub_answers_hermes_provider(tmp_path, hermes_python):
    """Hermes' Supermemory provider, configured as a profile is (its `supermemory.json`), against the stub:
    prefetch, every tool, the session's conversation; the container tag arrives as minted."""
    reg = registry_with_services(tmp_path)
    a = reg["alpha"]
    stub = SupermemoryStub(a).start()
    setup = services.SERVICES["supermemory"].configure(a, services.Where(url=stub.url))
    profile = tmp_path / "profile"
    profile.mkdir()
    for name, data in setup.files.items():
        (profile / name).write_bytes(data)
    try:
        got = run_in_hermes(hermes_python, tmp_path, f"""
            import json
            from plugins.memory.supermemory import SupermemoryMemoryProvider
            p = SupermemoryMemoryProvider()
            p.initialize("s1", hermes_home={str(profile)!r}, agent_identity="alpha")
            out = {{"prefetch": p.prefetch("what is in the environment")}}
            for tool, args in [("supermemory_store", {{"content": "note one of alpha"}}),
                               ("supermemory_search", {{"query": "note"}}),
                               ("supermemory_profile", {{"query": "note"}}),
                               ("supermemory_forget", {{"id": "alpha-1"}}),
                               ("supermemory_forget", {{"id": "default-record"}})]:
                out[tool + str(len(out))] = json.loads(p.handle_tool_call(tool, args))
            p.on_session_end([{{"role": "user", "content": "remember the environment, please"}},
                              {{"role": "assistant", "content": "noted"}}])
            print(json.dumps(out))
        """, setup.env)
    finally:
        stub.stop()
    assert a.canaries["supermemory_record"] in got["prefetch"]
    assert got["supermemory_store1"]["saved"] and got["supermemory_store1"]["id"] == "alpha-1"
    assert a.canaries["supermemory_record"] in got["supermemory_search2"]["results"][0]["content"]
    assert got["supermemory_search2"]["results"][1]["content"] == "note one of alpha"
    assert a.canaries["supermemory_record"] in got["supermemory_profile3"]["profile"]
    assert got["supermemory_forget4"] == {"forgotten": True, "id": "alpha-1"}
    assert "error" in got["supermemory_forget5"]  # another tenant's record: not found at alpha's service
    seen = stub.snapshot()
    assert [(r.method, r.path) for r in seen] == [
        ("POST", "/v4/profile"), ("POST", "/v3/documents"), ("POST", "/v4/search"), ("POST", "/v4/profile"),
        ("DELETE", "/v4/memories"), ("DELETE", "/v4/memories"), ("POST", "/v4/conversations")]
    bodies = [json.loads(r.body) for r in seen]
    tag = a.canaries["supermemory_tag"]
    assert [b.get("containerTag") or b.get("containerTags") for b in bodies] == [tag, [tag], tag, tag, tag, tag,
                                                                                 [tag]]
    assert not any(r.wrong_key for r in seen)
    assert {r.headers["authorization"] for r in seen} == {f"Bearer {a.canaries['supermemory_key']}"}


def test_another_tenants_container_tag_is_wrong_identity_and_a_near_miss_is_nothing(tmp_path):
    reg = registry_with_services(tmp_path)
    own = [("Authorization", f"Bearer {reg['alpha'].canaries['supermemory_key']}")]
    theirs = reg["default"].canaries["supermemory_tag"]
    report = inspect(reg, "supermemory", own, {"q": "q", "containerTag": theirs})
    assert kinds(report) == [("wrong_identity", "default", "supermemory_tag", "supermemory")]
    assert inspect(reg, "supermemory", own, {"q": "q", "containerTag": theirs[:-2]}).findings == []
    assert inspect(reg, "supermemory", own, {"q": "q", "containerTag": reg["alpha"].canaries["supermemory_tag"]}
                   ).findings == []


def test_the_tavily_stub_answers_hermes_web_backend(tmp_path, hermes_python):
    reg = registry_with_services(tmp_path)
    a, d = reg["alpha"], reg["default"]
    stub = TavilyStub(a).start()
    try:
        got = run_in_hermes(hermes_python, tmp_path, """
            import json
            from plugins.web.tavily.provider import _tavily_request, _normalize_tavily_search_results, \\
                _normalize_tavily_documents
            s = _normalize_tavily_search_results(_tavily_request("search", {"query": "hello", "max_results": 3}))
            e = _normalize_tavily_documents(_tavily_request("extract", {"urls": ["http://127.0.0.1:9/p"]}))
            print(json.dumps({"search": s, "extract": e}))
        """, {"TAVILY_API_KEY": d.canaries["web_key"], "TAVILY_BASE_URL": stub.url})
    finally:
        stub.stop()
    assert a.canaries["web_record"] in got["search"]["data"]["web"][0]["description"]
    assert a.canaries["web_record"] in got["extract"][0]["content"]
    assert [r.wrong_key for r in stub.snapshot()] == [True, True]  # default's key at alpha's service


def test_the_mcp_http_stub_answers_the_mcp_client_hermes_uses(tmp_path, hermes_python):
    reg = registry_with_services(tmp_path)
    a = reg["alpha"]
    stub = McpHttpStub(a).start()
    try:
        got = run_in_hermes(hermes_python, tmp_path, f"""
            import asyncio, json
            import httpx
            from mcp import ClientSession
            from mcp.client.streamable_http import streamable_http_client

            async def main():
                client = httpx.AsyncClient(headers={{"Authorization": "Bearer {a.canaries['mcp_key']}"}})
                async with streamable_http_client("{stub.url}/mcp", http_client=client) as (r, w, _):
                    async with ClientSession(r, w) as s:
                        await s.initialize()
                        tools = [t.name for t in (await s.list_tools()).tools]
                        await s.call_tool("remember", {{"note": "hello"}})
                        out = await s.call_tool("recall", {{}})
                        return {{"tools": tools, "recall": out.content[0].text}}
            print(json.dumps(asyncio.run(main())))
        """)
    finally:
        stub.stop()
    assert got["tools"] == ["remember", "recall"]
    recall = json.loads(got["recall"])
    assert recall["notes"] == ["hello"] and a.canaries["mcp_record"] in recall["record"]
    seen = stub.snapshot()
    assert seen and not any(r.wrong_key for r in seen) and {r.status for r in seen} <= {200, 202}


def test_the_mcp_stdio_server_records_itself_for_the_mcp_client(tmp_path, hermes_python):
    import sys

    reg = registry_with_services(tmp_path)
    reg.save(tmp_path / "registry.yaml")
    a = reg["alpha"]
    folder = tmp_path / "services"
    folder.mkdir()
    args = ["-m", "harness.capture.stubs.mcp_stdio", "--registry", str(tmp_path / "registry.yaml"),
            "--tenant", "alpha", "--log", str(folder)]
    got = run_in_hermes(hermes_python, tmp_path, f"""
        import asyncio, json
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        async def main():
            params = StdioServerParameters(command={sys.executable!r}, args={args!r},
                                           env={{"TENANCY_MCP_STDIO_KEY": {a.canaries['mcp_stdio_key']!r}}})
            async with stdio_client(params) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    await s.call_tool("remember", {{"note": "hello"}})
                    return (await s.call_tool("recall", {{}})).content[0].text
        print(json.dumps(asyncio.run(main())))
    """)
    assert json.loads(got)["notes"] == ["hello"]
    (record,) = records.read(folder, reg)
    assert record.tenant == "alpha" and [ln.event["event"] for ln in record.lines] == ["start", "call", "call"]
    assert record.lines[0].event["wrong_key"] is False
    assert records.check(record, reg, matcher_for(reg)) == []
    assert (folder / record.path.name).stat().st_mode & 0o777 == 0o600


#: An MCP client's session with a server: every kind of message the stdio server answers, and one it does not know.
MCP_SESSION = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize",
     "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
    {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "remember", "arguments": {"note": "n1"}}},
    {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "recall", "arguments": {}}},
    {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "forget", "arguments": {}}},
    *({"jsonrpc": "2.0", "id": 6 + i, "method": m} for i, m in enumerate(
        ["ping", "resources/list", "prompts/list", "resources/templates/list", "sampling/unknown"])),
    {"jsonrpc": "2.0", "id": 11, "method": "initialize",
     "params": {"protocolVersion": "1999-01-01", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
]


def test_the_stdio_mcp_server_answers_as_the_sdks_server():
    """The stdio server answers without the SDK (its import made the server late for Hermes' one-shot turn): every
    answer of a session is the one the SDK's server (`mcp_tools.server`, the HTTP stub's) gives."""
    import sys

    def replies(code: str) -> list[dict]:
        done = subprocess.run([sys.executable, "-c", code], input="".join(json.dumps(m) + "\n" for m in MCP_SESSION),
                              capture_output=True, text=True, timeout=60)
        return [json.loads(line) for line in done.stdout.splitlines()]

    notes = "mcp_tools.Notes('alpha', 'record-canary')"
    sdk = replies(f"from harness.capture.stubs import mcp_tools; mcp_tools.server({notes}).run('stdio')")
    ours = replies("import sys; from harness.capture.stubs import mcp_stdio, mcp_tools; "
                   f"mcp_stdio.serve({notes}, lambda entry: None, sys.stdin, sys.stdout)")
    assert len(sdk) == len(MCP_SESSION) - 1 and ours == sdk
    assert json.loads(ours[3]["result"]["content"][0]["text"])["notes"] == ["n1"]


def test_the_aux_stub_is_the_provider_kind_under_its_own_credential(tmp_path):
    reg = registry_with_services(tmp_path)
    stub = StubProvider(reg["alpha"], service="aux")
    assert stub.expected == reg["alpha"].canaries["aux_key"]


def test_a_stub_that_cannot_start_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """A service stub that does not come up is a ServiceError naming it; the CLI makes it one line, exit 2."""
    import uvicorn

    from harness import cli
    from harness.capture.stubs.base import ServiceError

    reg = registry_with_services(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)  # the server thread ends, never serving
        with pytest.raises(ServiceError, match="the mcp stub of tenant 'alpha' did not start within 5 s"):
            McpHttpStub(reg["alpha"]).start(timeout=5)

    def refuse(opts):
        raise ServiceError("the web stub of tenant 'alpha' cannot listen on 127.0.0.1: Address already in use")

    monkeypatch.setattr(cli, "run_audit", refuse)
    assert cli.main(["run", "--out", str(tmp_path / "ev")]) == 2
    err = capsys.readouterr().err
    assert err == "tenancy-audit: the web stub of tenant 'alpha' cannot listen on 127.0.0.1: Address already in use\n"


def test_the_honcho_stub_answers_hermes_honcho_provider(tmp_path, hermes_python):
    """Hermes' Honcho plugin (the SDK underneath), from a profile's `honcho.json`: session start, a turn's
    prefetch and sync, and every tool, all answered in the shapes the SDK validates."""
    a = registry_with_services(tmp_path)["alpha"]
    c = a.canaries
    stub = HonchoStub(a).start()
    home = tmp_path / "home" / ".hermes"
    home.mkdir(parents=True)
    (home / "honcho.json").write_text(json.dumps(honcho_json(a, stub.url, host="hermes")))  # the default profile
    (home / "memories").mkdir()
    (home / "memories" / "MEMORY.md").write_text("a memory of the profile\n")  # uploaded at the session's start
    try:
        got = run_in_hermes(hermes_python, tmp_path, """
            import json
            from plugins.memory.honcho import HonchoMemoryProvider
            from plugins.memory.honcho.client import profile_host_key
            p = HonchoMemoryProvider()
            p.initialize("sess-1", platform="cli")
            if p._init_thread is not None:  # the session starts in a thread: wait for it, not for a clock
                p._init_thread.join(60)
            out = {"ready": p._session_initialized, "prefetch": p.prefetch("what is in the environment?")}
            p.sync_turn("user says hello", "assistant says hi")
            if p._sync_thread is not None:  # the sync too: the tools below read what it wrote
                p._sync_thread.join(60)
            calls = [("honcho_conclude", {"conclusion": "note one"}), ("honcho_profile", {"card": ["card one"]}),
                     ("honcho_profile", {}), ("honcho_context", {}), ("honcho_search", {"query": "environment"}),
                     ("honcho_reasoning", {"query": "what?"}), ("honcho_conclude", {"list": True}),
                     ("honcho_conclude", {"delete_id": "alpha-conclusion"}),
                     ("honcho_conclude", {"delete_id": "default-conclusion"})]
            out["tools"] = [p.handle_tool_call(n, args) for n, args in calls]
            p.shutdown()
            out["hosts"] = {n: profile_host_key(n) for n in ("default", "alpha", "beta-2", "a.b")}
            print(json.dumps(out))
        """)
    finally:
        stub.stop()
    assert got["hosts"] == {n: host_key(n) for n in got["hosts"]}  # the host block Hermes reads per profile
    assert got["ready"] and c["honcho_record"] in got["prefetch"]
    saved, card, read, context, search, reasoning, listed, deleted, missing = got["tools"]
    assert "note one" in saved and "card one" in card and "card one" in read and "error" not in deleted
    assert all(c["honcho_record"] in r for r in (context, search, reasoning, listed))
    assert "user says hello" in context and "note one" in listed and "Failed to delete" in missing
    seen = stub.snapshot()
    assert all(r.path.startswith(f"/v3/workspaces/{c['honcho_workspace']}") for r in seen[1:])
    assert [r.status for r in seen].count(404) == 1 and {r.status for r in seen} == {200, 404}
    assert any(r.path.endswith("/messages/upload") and b"a memory of the profile" in r.body for r in seen)
    assert any(c["honcho_peer"] in r.body.decode() and "user says hello" in r.body.decode() for r in seen)
    assert not any(r.wrong_key for r in seen)


@pytest.mark.parametrize(("plant", "field", "kind"), [
    ("honcho-key", "apiKey", "honcho_key"), ("honcho-workspace", "workspace", "honcho_workspace"),
    ("honcho-peer", "peerName", "honcho_peer")])
def test_a_honcho_plant_puts_the_donors_value_in_the_targets_host_block(tmp_path, plant, field, kind):
    reg = registry_with_services(tmp_path)
    donor, target = reg["default"], reg["alpha"]
    home = tmp_path / "alpha-home"
    home.mkdir()
    setup = services.SERVICES["honcho"].configure(target, services.Where("http://127.0.0.1:9"))
    (home / "honcho.json").write_bytes(setup.files["honcho.json"])
    (home / ".env").write_text("".join(f"{k}={v}\n" for k, v in setup.env.items()))
    apply(plant, PlantContext(donor, target, home, "http://127.0.0.1:9", "http://127.0.0.1:8"))
    block = json.loads((home / "honcho.json").read_text())["hosts"]["hermes_alpha"]
    assert block[field] == donor.canaries[kind]
    assert {k: v for k, v in block.items() if k != field} == \
        {k: v for k, v in honcho_json(target, "")["hosts"]["hermes_alpha"].items() if k != field}
    env = (home / ".env").read_text()
    assert (f"HONCHO_API_KEY={donor.canaries['honcho_key']}" in env) == (plant == "honcho-key")
