#!/usr/bin/env python3
"""Drives `cloud-harness serve` with the official MCP Python SDK (`mcp` from PyPI).

    scenario.py CONFIG.json PART

CONFIG holds how to reach the server (stdio command or HTTP URL), the protocol mode
("legacy": the 2025-11-25 initialize handshake; "modern": session-less 2026-07-28), and the
fixtures the Rust side built (toolkit specs, project URLs). PART picks the scenario. Every
check is an assert; the exit status tells the Rust test the outcome.
"""

import asyncio
import json
import os
import subprocess
import sys
import time

from mcp import Client
from mcp.client.stdio import StdioServerParameters

CONFIG = json.load(open(sys.argv[1]))
PART = sys.argv[2]
AUTH = {"Authorization": "Bearer " + CONFIG["token"]} if CONFIG.get("token") else {}


def client():
    # "auto" discovers the server and adopts the session-less 2026-07-28 protocol.
    mode = "legacy" if CONFIG["mode"] == "legacy" else "auto"
    if CONFIG["transport"] == "stdio":
        target = StdioServerParameters(command=CONFIG["binary"], args=["serve"], env=CONFIG["env"])
    else:
        # The server's first start made an operator token: sent as a bearer token.
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client
        target = streamable_http_client(CONFIG["url"], http_client=create_mcp_http_client(headers=AUTH))
    return Client(target, mode=mode, read_timeout_seconds=120)


async def call(c, name, args, **kw):
    r = await c.call_tool(name, args, **kw)
    return r.is_error, r.structured_content


async def ok(c, name, args, **kw):
    err, out = await call(c, name, args, **kw)
    assert not err, f"{name} {args} failed: {out}"
    return out


async def refused(c, name, args, code, field=None):
    err, out = await call(c, name, args)
    assert err, f"{name} {args} should fail with {code}, got {out}"
    assert out["code"] == code, f"{name} {args}: {out}"
    assert out["status"] == {"INVALID_ARGUMENT": 400, "FORBIDDEN": 403, "NOT_FOUND": 404, "CONFLICT": 409}[code]
    if field is not None:
        assert (out.get("details") or {}).get("field") == field, f"{name} {args}: {out}"
    return out


def workspace_folders():
    """The folders of workspaces under the home, but for spare executors' shells (a spare's
    folder holds a file `spare` until an open takes it)."""
    root = os.path.join(CONFIG["home"], "workspaces")
    return {d for d in os.listdir(root) if not os.path.exists(os.path.join(root, d, "spare"))}


def exec_in(handle, script):
    """`cloud-harness exec HANDLE -- sh -c SCRIPT`: what a person or platform runs."""
    r = subprocess.run([CONFIG["binary"], "exec", handle, "--", "sh", "-c", script],
                       env=CONFIG["env"], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def inside(handle, script):
    rc, out, err = exec_in(handle, script)
    assert rc == 0, f"{script!r} in {handle}: exit {rc}: {out}{err}"
    return out


async def served_digest(c, handle, name):
    listing = await ok(c, "skills_list", {"workspace": handle})
    return [s for s in listing["skills"] if s["name"] == name][0]["digest"]


def bounded(where, schema):
    """Every string and array argument states its limit in the schema."""
    kind = schema.get("type")
    if kind == "string":
        assert "enum" in schema or "maxLength" in schema, f"{where}: a string without maxLength"
    if kind == "array":
        assert "maxItems" in schema, f"{where}: an array without maxItems"
        bounded(where + "[]", schema["items"])
    for name, sub in schema.get("properties", {}).items():
        bounded(f"{where}.{name}", sub)


async def full():
    fx = CONFIG["fixtures"]
    async with client() as c:
        assert c.server_info.name == "cloud-harness" and c.server_info.version, c.server_info
        want = "2025-11-25" if CONFIG["mode"] == "legacy" else "2026-07-28"
        assert c.protocol_version == want, c.protocol_version
        names = sorted(t.name for t in (await c.list_tools()).tools)
        assert names == ["skills_list", "skills_read", "skills_run", "workspace_close", "workspace_open"], names
        for t in (await c.list_tools()).tools:
            assert "$ref" not in json.dumps(t.input_schema), t.name
            bounded(t.name, t.input_schema)
            # A title, every behaviour hint stated, and the shape of the result.
            assert t.title, t.name
            hints = t.annotations
            assert None not in (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint, hints.open_world_hint), (t.name, hints)
            assert t.output_schema and t.output_schema["type"] == "object", t.name
        hints = {t.name: t.annotations for t in (await c.list_tools()).tools}
        assert hints["skills_list"].read_only_hint and hints["skills_read"].read_only_hint
        assert not hints["skills_run"].read_only_hint and hints["skills_run"].destructive_hint
        assert hints["workspace_open"].idempotent_hint and hints["workspace_open"].open_world_hint

        # Open: a preset-shaped toolkit (through the mirror) and a git toolkit, owner scope.
        request = {
            "repositoryUrl": fx["project"],
            "idempotencyKey": fx["key"],
            "toolkits": [fx["preset"], fx["team"]],
        }
        ws = await ok(c, "workspace_open", request)
        handle = ws["workspace"]
        assert handle.startswith("ws_") and len(handle) >= 32, handle
        # Every path a model is given is the executor's.
        executor = ws["executor"]
        assert executor["kind"] == CONFIG["executor"], executor
        assert ws["path"] == "/workspace" and ws["skillsMount"] == "/opt/cloud-harness/skills", ws
        assert ws["ownerSkillsMount"] == "/opt/cloud-harness/owner-skills", ws
        assert executor["paths"]["skills"] == ws["skillsMount"] and executor["network"] == "none", executor
        assert (executor["id"] is not None) == (CONFIG["executor"] == "docker"), executor
        inside(handle, "test -d /workspace/.git")
        assert inside(handle, "git -C /workspace status --porcelain") == "", "owner scope must leave the working tree clean"
        kits = {t["instanceId"]: t for t in ws["toolkits"]}
        assert set(kits) == {"obra-superpowers", "team"}, kits
        assert kits["team"]["commit"] == fx["team"]["ref"] and kits["team"]["bundle"].startswith("sha256:")
        assert kits["obra-superpowers"]["skillCount"] == 2
        served = {s["name"]: s for s in ws["skills"]}
        assert served["review"]["tier"] == "owner" and served["review"]["toolkit"] == "team", served["review"]
        assert served["cloud-harness-skills"]["tier"] == "builtin"
        # The project's own copy of `lint` is shadowed by the team toolkit's.
        shadowed = [s for s in ws["shadowed"] if s["name"] == "lint"]
        assert shadowed and shadowed[0]["tier"] == "repository", ws["shadowed"]
        assert ws["conflicts"] == []
        start = ws["sessionStart"]
        assert start and start[0]["skill"] == "using-superpowers", start
        assert any(m["mentioned"] == "Skill" and m["use"] == "skills_read" for m in start[0]["toolMapping"]), start
        assert "Review code" in inside(handle, "cat /opt/cloud-harness/skills/review/SKILL.md")
        inside(handle, "test -d /opt/cloud-harness/owner-skills/review && test ! -e /opt/cloud-harness/owner-skills/cloud-harness-skills")

        prompts = await c.list_prompts()
        assert [p.name for p in prompts.prompts] == ["session-start"]
        prompt = await c.get_prompt("session-start", {"workspace": handle})
        assert "skills_read" in prompt.messages[0].content.text

        # Idempotency: the same key and request, the same result; sixteen at once, one workspace.
        again = await ok(c, "workspace_open", request)
        assert again == ws, "a replayed key must return the same result"
        same = await asyncio.gather(*[ok(c, "workspace_open", request) for _ in range(16)])
        assert all(r["workspace"] == handle for r in same)
        other = dict(request, toolkits=[fx["team"]])
        await refused(c, "workspace_open", other, "CONFLICT", "idempotencyKey")
        concurrent_key = dict(request, idempotencyKey=fx["key"] + "-burst")
        burst = await asyncio.gather(*[ok(c, "workspace_open", concurrent_key) for _ in range(16)])
        assert len({r["workspace"] for r in burst}) == 1, "sixteen concurrent opens must make one workspace"
        await ok(c, "workspace_close", {"workspace": burst[0]["workspace"]})

        # List and read.
        listing = await ok(c, "skills_list", {"workspace": handle, "includeShadowed": True})
        # The text block, for clients without structured output, is the same listing as JSON.
        r = await c.call_tool("skills_list", {"workspace": handle, "includeShadowed": True})
        assert json.loads(r.content[0].text) == r.structured_content == listing, r.content[0].text[:200]
        by_name = {s["name"]: s for s in listing["skills"]}
        assert by_name["lint"]["shadowed"][0]["tier"] == "repository"
        assert by_name["brainstorm"]["userOnly"] is True
        # Every skill folder a listing names, served or shadowed, of every tier, is readable in the executor.
        paths = [s["path"] for s in listing["skills"]] + [x["path"] for s in listing["skills"] for x in s["shadowed"]]
        tiers = {s["tier"] for s in listing["skills"]} | {x["tier"] for s in listing["skills"] for x in s["shadowed"]}
        assert tiers == {"builtin", "owner", "repository"}, tiers
        assert all(p.startswith("/opt/cloud-harness/skills/") for p in paths), paths
        assert inside(handle, " ".join(f"test -r '{p}/SKILL.md' || echo missing {p};" for p in paths)) == ""
        # Pages of one skill each, followed by nextCursor, add up to the whole listing.
        paged, cursor = [], None
        while True:
            args = {"workspace": handle, "limit": 1} | ({"cursor": cursor} if cursor else {})
            page = await ok(c, "skills_list", args)
            assert page["count"] == len(page["skills"]) <= 1, page
            paged += [s["name"] for s in page["skills"]]
            cursor = page.get("nextCursor")
            if not cursor:
                break
        assert paged == [s["name"] for s in listing["skills"]] and len(paged) > 2, paged
        repo_tier = await ok(c, "skills_list", {"workspace": handle, "tier": "repository"})
        assert [(s["name"], s["served"]) for s in repo_tier["skills"]] == [("lint", False), ("probe", True)], repo_tier
        assert repo_tier["skills"][0]["path"] == "/opt/cloud-harness/skills/.tiers/repository/lint"
        # The same skill as an MCP resource (the Skills extension), read through the SDK.
        uri = f"skill://{handle}/review/SKILL.md"
        listed = [str(r.uri) for r in (await c.list_resources()).resources]
        assert uri in listed, listed[:20]
        contents = (await c.read_resource(uri)).contents
        assert "Review code" in contents[0].text, contents
        page = await ok(c, "skills_read", {"workspace": handle, "skill": "review"})
        assert page["path"] == "SKILL.md" and "Review code" in page["content"] and page["eof"]
        assert page["executorPath"] == "/opt/cloud-harness/skills/review/SKILL.md", page
        big, offset, pages = b"", 0, 0
        while True:
            p = await ok(c, "skills_read", {"workspace": handle, "skill": "review", "path": "references/big.md", "offset": offset, "length": 100000})
            big += p["content"].encode()
            pages += 1
            if p["eof"]:
                break
            offset = p["nextOffset"]
        assert len(big) == p["size"] == 300000 and pages == 3, (len(big), pages)

        # Run: refused until approved, then run, with progress. A script the skill lacks is
        # NOT_FOUND, approved or not.
        await refused(c, "skills_run", {"workspace": handle, "skill": "review", "script": "scripts/nope.sh"}, "NOT_FOUND", "script")
        out = await refused(c, "skills_run", {"workspace": handle, "skill": "review", "script": "scripts/check.sh"}, "FORBIDDEN")
        assert "approvedSkills" in out["message"], out
        operator = os.path.join(CONFIG["home"], "operator.json")
        with open(operator, "w") as f:
            json.dump({"approvedSkills": [by_name["review"]["digest"]]}, f)
        run = await ok(c, "skills_run", {"workspace": handle, "skill": "review", "script": "scripts/check.sh", "args": ["a b", "c"]})
        assert run["exitCode"] == 0 and run["stdout"] == "args: a b|c\ncwd ok\n", run
        assert run["command"][0] == "sh", "a .sh without its executable bit runs through sh"
        # It ran inside: cwd /workspace, a non-root uid, from the approved copy, read-only.
        where = await ok(c, "skills_run", {"workspace": handle, "skill": "review", "script": "scripts/where.sh"})
        lines = where["stdout"].splitlines()
        digest = by_name["review"]["digest"].split(":")[1]
        assert lines[0] == "/workspace" and lines[1] != "0", where
        assert lines[2] == f"/opt/cloud-harness/.by-digest/{digest}" == where["skillDir"], where
        assert "SKILL.md" in lines and lines[-1] == "read-only", where
        assert where["executor"] == CONFIG["executor"], where
        progress = []

        async def on_progress(value, total, message):
            progress.append((value, message))

        slow = await ok(c, "skills_run", {"workspace": handle, "skill": "review", "script": "scripts/slow.sh"}, progress_callback=on_progress)
        assert slow["exitCode"] == 0 and progress, (slow, progress)
        timeout = await ok(c, "skills_run", {"workspace": handle, "skill": "review", "script": "scripts/forever.sh", "timeoutSeconds": 1})
        assert timeout["timedOut"] is True, timeout
        await refused(c, "skills_run", {"workspace": handle, "skill": "tdd", "script": "run.sh"}, "FORBIDDEN")

        # Cancelling a run kills everything it started: its background beat stops.
        spawn = {"workspace": handle, "skill": "review", "script": "scripts/spawn.sh"}
        try:
            await asyncio.wait_for(c.call_tool("skills_run", spawn), timeout=2)
            raise AssertionError("spawn.sh runs forever; the call should have been cancelled")
        except (asyncio.TimeoutError, TimeoutError):
            pass
        assert inside(handle, "cat /workspace/heartbeat").strip(), "the beat never started"
        await asyncio.sleep(1.5)
        first = inside(handle, "cat /workspace/heartbeat")
        await asyncio.sleep(1)
        assert inside(handle, "cat /workspace/heartbeat") == first, "a cancelled run's processes still run"
        inside(handle, "rm -f /workspace/heartbeat /workspace/.beat")

        # The bytes that run are the approved ones. The project's own `probe` is approved,
        # then edited inside the executor (a live tier): the edit never runs unapproved.
        probe = by_name["probe"]
        assert probe["tier"] == "repository", probe
        json.dump({"approvedSkills": [by_name["review"]["digest"], probe["digest"]]}, open(operator, "w"))
        out = await ok(c, "skills_run", {"workspace": handle, "skill": "probe", "script": "run.sh"})
        assert out["stdout"] == "v1\n", out
        for n in range(2, 5):
            inside(handle, f"echo 'echo v{n}' > /workspace/.claude/skills/probe/run.sh")
            err, out = await call(c, "skills_run", {"workspace": handle, "skill": "probe", "script": "run.sh"})
            if err:
                assert out["code"] == "FORBIDDEN" and out["details"]["digest"] != probe["digest"], out
            else:
                assert out["stdout"] == "v1\n" and out["digest"] == probe["digest"], out
        # Once the live tier has settled on the last edit, that edit needs its own approval.
        deadline, last, stable_since = time.time() + 15, None, time.time()
        while True:
            now = await served_digest(c, handle, "probe")
            if now != last:
                last, stable_since = now, time.time()
            elif now != probe["digest"] and time.time() - stable_since > 0.8:
                break
            assert time.time() < deadline, "the edits never made a settled generation"
            await asyncio.sleep(0.1)
        out = await refused(c, "skills_run", {"workspace": handle, "skill": "probe", "script": "run.sh"}, "FORBIDDEN")
        json.dump({"approvedSkills": [out["details"]["digest"]]}, open(operator, "w"))
        out = await ok(c, "skills_run", {"workspace": handle, "skill": "probe", "script": "run.sh"})
        assert out["stdout"] == "v4\n", out
        # A script that is a link out of its skill is not even served: it never runs.
        out = await refused(c, "skills_run", {"workspace": handle, "skill": "probe", "script": "escape.sh"}, "NOT_FOUND", "script")
        rc, _, _ = exec_in(handle, "test -e /opt/cloud-harness/skills/probe/escape.sh || test -L /opt/cloud-harness/skills/probe/escape.sh")
        assert rc != 0, "the escaping link is served"
        inside(handle, "cd /workspace && git checkout -q -- .claude/skills/probe/run.sh")
        os.remove(operator)

        # Conflicts: two owner toolkits with different `review` skills, and a workspace-scope
        # skill that differs from the project's own copy. Neither leaves a workspace behind.
        before = workspace_folders()
        out = await refused(c, "workspace_open", {"idempotencyKey": fx["key"] + "-clash", "toolkits": [fx["team"], fx["clash"]]}, "CONFLICT")
        assert "review" in out["message"] and "team" in out["message"] and "clash" in out["message"], out
        out = await refused(c, "workspace_open", {"idempotencyKey": fx["key"] + "-ws-clash", "repositoryUrl": fx["conflictProject"], "toolkits": [fx["wsScope"]], "allowToolkitWorkspaceChanges": True}, "CONFLICT")
        assert "wsx" in out["message"] and out["details"]["existing"] != out["details"]["incoming"], out
        await refused(c, "workspace_open", {"idempotencyKey": fx["key"] + "-noflag", "toolkits": [fx["wsScope"]]}, "INVALID_ARGUMENT", "allowToolkitWorkspaceChanges")
        assert workspace_folders() == before

        # Two workspace-scope toolkits bringing `review`: a same-tier collision like any other,
        # refused with nothing written, then settled by an override naming the source.
        both = {"toolkits": [dict(fx["team"], scope="workspace"), dict(fx["clash"], scope="workspace")], "allowToolkitWorkspaceChanges": True}
        out = await refused(c, "workspace_open", dict(both, idempotencyKey=fx["key"] + "-ws-both"), "CONFLICT")
        assert "review" in out["message"] and "workspace:team" in out["message"] and "workspace:clash" in out["message"], out
        assert workspace_folders() == before
        with open(operator, "w") as f:
            json.dump({"overrides": [{"skill": "review", "source": "workspace:clash"}]}, f)
        settled = await ok(c, "workspace_open", dict(both, idempotencyKey=fx["key"] + "-ws-both-settled"))
        review = [s for s in settled["skills"] if s["name"] == "review"][0]
        assert review["tier"] == "workspace" and review["toolkit"] == "clash", review
        assert "A different review." in inside(settled["workspace"], "cat /workspace/.cloud-harness/skills/review/SKILL.md")
        os.remove(operator)
        await ok(c, "workspace_close", {"workspace": settled["workspace"]})

        # An operator override settles the owner-tier collision.
        with open(operator, "w") as f:
            json.dump({"overrides": [{"skill": "review", "source": "owner:clash"}]}, f)
        settled = await ok(c, "workspace_open", {"idempotencyKey": fx["key"] + "-settled", "toolkits": [fx["team"], fx["clash"]]})
        review = [s for s in settled["skills"] if s["name"] == "review"][0]
        assert review["toolkit"] == "clash", review
        assert [x["skill"] for x in settled["conflicts"]] == ["review"], settled["conflicts"]
        os.remove(operator)
        await ok(c, "workspace_close", {"workspace": settled["workspace"]})

        # The same workspace skill already in the project, with the same content: fine.
        same = await ok(c, "workspace_open", {"idempotencyKey": fx["key"] + "-ws-same", "repositoryUrl": fx["sameProject"], "toolkits": [fx["wsScope"]], "allowToolkitWorkspaceChanges": True})
        await ok(c, "workspace_close", {"workspace": same["workspace"]})

        # Workspace scope, allowed: written into .cloud-harness/skills/, served from the workspace tier.
        wss = await ok(c, "workspace_open", {"idempotencyKey": fx["key"] + "-ws", "toolkits": [fx["wsScope"]], "allowToolkitWorkspaceChanges": True})
        inside(wss["workspace"], "test -f /workspace/.cloud-harness/skills/wsx/SKILL.md && test -w /workspace/.cloud-harness/skills/wsx/SKILL.md")
        wsx = [s for s in wss["skills"] if s["name"] == "wsx"][0]
        assert wsx["tier"] == "workspace" and wsx["toolkit"] == "ws-kit", wsx
        # The workspace tier's path, too, is readable in the executor.
        assert wsx["path"] == "/opt/cloud-harness/skills/wsx", wsx
        inside(wss["workspace"], f"test -r {wsx['path']}/SKILL.md")
        await ok(c, "workspace_close", {"workspace": wss["workspace"]})
        # Closing frees the key: it may name another request now.
        again = await ok(c, "workspace_open", {"idempotencyKey": fx["key"] + "-ws"})
        assert again["workspace"] != wss["workspace"]
        await ok(c, "workspace_close", {"workspace": again["workspace"]})

        closed = await ok(c, "workspace_close", {"workspace": handle})
        assert closed["closed"] is True
        await refused(c, "skills_list", {"workspace": handle}, "NOT_FOUND", "workspace")
        assert handle not in workspace_folders()
        rc, out, err = exec_in(handle, "true")
        assert rc == 125 and "no open workspace" in err, (rc, out, err)


async def bad_input():
    async with client() as c:
        ws = await ok(c, "workspace_open", {"idempotencyKey": "bad-input"})
        h = ws["workspace"]
        huge = "x" * (1 << 20)
        cases = [
            ("workspace_open", {}, "idempotencyKey"),
            ("workspace_open", {"idempotencyKey": 7}, "idempotencyKey"),
            ("workspace_open", {"idempotencyKey": huge}, "idempotencyKey"),
            ("workspace_open", {"idempotencyKey": "k\x00"}, "idempotencyKey"),
            ("workspace_open", {"idempotencyKey": "k", "toolkits": "obra/superpowers"}, "toolkits"),
            ("workspace_open", {"idempotencyKey": "k", "toolkits": [{"kind": "git", "instanceId": "x", "url": "http://example.com/x.git"}]}, "toolkits[0].url"),
            ("workspace_open", {"idempotencyKey": "k", "toolkits": [{"kind": "git", "instanceId": "x", "url": huge}]}, "toolkits[0].url"),
            ("workspace_open", {"idempotencyKey": "k", "repositoryUrl": "file:///etc"}, "repositoryUrl"),
            ("workspace_open", {"idempotencyKey": "k", "allowToolkitWorkspaceChanges": "yes"}, "allowToolkitWorkspaceChanges"),
            ("workspace_open", {"idempotencyKey": "k", "surprise": 1}, "surprise"),
            ("workspace_close", {}, "workspace"),
            ("workspace_close", {"workspace": ["a"]}, "workspace"),
            ("workspace_close", {"workspace": huge}, "workspace"),
            ("workspace_open", {"idempotencyKey": "k", "toolkits": [{"kind": "preset", "id": "obra/superpowers"}] * 33}, "toolkits"),
            ("workspace_open", {"idempotencyKey": "k", "repositoryUrl": "https://github.com/" + "x" * 3000}, "repositoryUrl"),
            ("workspace_open", {"idempotencyKey": "k", "toolkits": [{"kind": "git", "instanceId": "x", "url": "https://github.com/a/b", "skills": {"include": ["a"] * 257}}]}, "toolkits[0].skills.include"),
            ("workspace_open", {"idempotencyKey": "k", "toolkits": [{"kind": "git", "instanceId": "x", "url": "https://github.com/a/b", "skills": {"exclude": ["a" * 300]}}]}, "toolkits[0].skills.exclude"),
            ("workspace_open", {"idempotencyKey": "k", "toolkits": [{"kind": "git", "instanceId": "x", "url": "https://github.com/a/b", "layout": {"skillRoots": ["s"] * 17}}]}, "toolkits[0].layout.skillRoots"),
            ("skills_list", {"workspace": huge}, "workspace"),
            ("skills_read", {"workspace": h, "skill": huge}, "skill"),
            ("skills_run", {"workspace": h, "skill": "cloud-harness-skills", "script": "a.sh", "args": ["a"] * 257}, "args"),
            ("skills_list", {"workspace": h, "tier": "everything"}, "tier"),
            ("skills_list", {"workspace": h, "includeShadowed": 1}, "includeShadowed"),
            ("skills_list", {"workspace": h, "cursor": "bogus"}, "cursor"),
            ("skills_list", {"workspace": h, "limit": 0}, "limit"),
            ("skills_list", {"workspace": h, "limit": 1001}, "limit"),
            ("skills_read", {"workspace": h}, "skill"),
            ("skills_read", {"workspace": h, "skill": "cloud-harness-skills", "path": "../../etc/passwd"}, "path"),
            ("skills_read", {"workspace": h, "skill": "cloud-harness-skills", "path": "/etc/passwd"}, "path"),
            ("skills_read", {"workspace": h, "skill": "cloud-harness-skills", "path": "SKILL.md\x00"}, "path"),
            ("skills_read", {"workspace": h, "skill": "cloud-harness-skills", "path": huge}, "path"),
            ("skills_read", {"workspace": h, "skill": "cloud-harness-skills", "offset": -1}, "offset"),
            ("skills_read", {"workspace": h, "skill": "cloud-harness-skills", "length": 0}, "length"),
            ("skills_read", {"workspace": h, "skill": "cloud-harness-skills", "length": 1 << 30}, "length"),
            ("skills_run", {"workspace": h, "skill": "cloud-harness-skills"}, "script"),
            ("skills_run", {"workspace": h, "skill": "cloud-harness-skills", "script": "../x.sh"}, "script"),
            ("skills_run", {"workspace": h, "skill": "cloud-harness-skills", "script": "/bin/sh"}, "script"),
            ("skills_run", {"workspace": h, "skill": "cloud-harness-skills", "script": "a.sh", "args": "no"}, "args"),
            ("skills_run", {"workspace": h, "skill": "cloud-harness-skills", "script": "a.sh", "args": ["\x00"]}, "args[0]"),
            ("skills_run", {"workspace": h, "skill": "cloud-harness-skills", "script": "a.sh", "timeoutSeconds": 100000}, "timeoutSeconds"),
        ]
        for name, args, field in cases:
            err, out = await call(c, name, args)
            assert err and out["code"] == "INVALID_ARGUMENT", f"{name} {str(args)[:120]}: {str(out)[:300]}"
            if field:
                assert out["details"]["field"] == field, f"{name} {str(args)[:120]}: {str(out)[:300]}"
        for name, args in [
            ("skills_list", {"workspace": "ws_nope"}),
            ("skills_read", {"workspace": h, "skill": "no-such-skill"}),
            ("skills_read", {"workspace": h, "skill": "cloud-harness-skills", "path": "missing.md"}),
            ("workspace_close", {"workspace": "ws_nope"}),
        ]:
            err, out = await call(c, name, args)
            assert err and out["code"] == "NOT_FOUND", f"{name} {str(args)[:120]}: {str(out)[:300]}"
        try:
            await c.call_tool("no_such_tool", {})
            raise AssertionError("an unknown tool must be a JSON-RPC error")
        except Exception as e:  # MCPError from the SDK
            assert "no_such_tool" in str(e), e
        # Still serving.
        assert len((await c.list_tools()).tools) == 5
        await ok(c, "workspace_close", {"workspace": h})


async def restart(step):
    fx = CONFIG["fixtures"]
    request = {"idempotencyKey": fx["key"] + "-restart", "toolkits": [fx["team"]]}
    async with client() as c:
        result = await ok(c, "workspace_open", request)
        saved = os.path.join(CONFIG["home"], "restart.json")
        if step == 1:
            json.dump(result, open(saved, "w"))
        else:
            assert result == json.load(open(saved)), "the same key and request must give the same result after a restart"
            page = await ok(c, "skills_read", {"workspace": result["workspace"], "skill": "review"})
            assert "Review code" in page["content"]
            await refused(c, "workspace_open", dict(request, toolkits=[]), "CONFLICT", "idempotencyKey")
            await ok(c, "workspace_close", {"workspace": result["workspace"]})


async def origin():
    import urllib.request, urllib.error
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()
    req = urllib.request.Request(CONFIG["url"], data=body, method="POST", headers={**AUTH, 
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "Origin": "http://evil.example", "MCP-Protocol-Version": "2025-11-25"})
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("a foreign Origin must be refused")
    except urllib.error.HTTPError as e:
        assert e.code == 403, e.code
    # A name that is not this machine's (DNS rebinding): refused the same way.
    req = urllib.request.Request(CONFIG["url"], data=body, method="POST", headers={**AUTH, 
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
        "Host": "evil.example", "MCP-Protocol-Version": "2025-11-25"})
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("a foreign Host must be refused")
    except urllib.error.HTTPError as e:
        assert e.code == 403, e.code
    # Every loopback origin, in http and https, by name and by address, is this machine's.
    for allowed in ["http://localhost:3000", "https://localhost:3000", "http://127.0.0.1:3000",
                    "https://127.0.0.1:3000", "http://[::1]:3000", "https://[::1]:3000"]:
        req = urllib.request.Request(CONFIG["url"], data=body, method="POST", headers={**AUTH, 
            "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "Origin": allowed, "MCP-Protocol-Version": "2025-11-25"})
        try:
            urllib.request.urlopen(req, timeout=10)
        except urllib.error.HTTPError as e:
            assert e.code != 403, f"{allowed} refused"


def api_get(path):
    """A GET of the operator API beside the MCP endpoint, with the token."""
    import urllib.request
    url = CONFIG["url"].rsplit("/mcp", 1)[0] + path
    with urllib.request.urlopen(urllib.request.Request(url, headers=AUTH), timeout=30) as r:
        return json.load(r)


async def progress():
    """A cold open of six toolkits, four fetched at a time from a slow server: its progress
    grows; cancelled once a toolkit is in, it leaves no workspace and frees its key."""
    request = {"idempotencyKey": "progress-1", "toolkits": CONFIG["fixtures"]["many"]}
    seen = []
    reached = asyncio.Event()

    async def on_progress(value, total, message):
        seen.append((value, total, message))
        if value >= 1:
            reached.set()

    async with client() as c:
        before = workspace_folders()
        task = asyncio.create_task(c.call_tool("workspace_open", request, progress_callback=on_progress))
        await asyncio.wait_for(reached.wait(), 60)
        # The operator API shows the open in progress, with its step and counts.
        opening = api_get("/api/v1/workspaces")["opening"]
        assert len(opening) == 1 and opening[0]["idempotencyKey"] == "progress-1", opening
        assert opening[0]["step"] == "acquiring toolkits" and opening[0]["done"] >= 1, opening
        assert opening[0]["bytes"] > 0 and opening[0]["total"] == seen[0][1] - 1, opening
        assert not task.done(), f"the open ended before it was cancelled: {seen}"
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        values = [v for v, _, _ in seen]
        assert len(values) >= 2 and all(a < b for a, b in zip(values, values[1:])), seen
        total = seen[0][1]
        assert total is not None and all(t == total and v < t for v, t, _ in seen), seen
        assert "acquiring toolkits" in seen[-1][2], seen
        print(f"progress told before the cancel: {[(round(v, 2), t, m) for v, t, m in seen]}")
        # The server undoes the open: no folder of it stays, and it is no longer listed.
        deadline = time.time() + 30
        while workspace_folders() != before or api_get("/api/v1/workspaces")["opening"]:
            assert time.time() < deadline, f"a cancelled open left {workspace_folders() - before}"
            await asyncio.sleep(0.1)
        # Its key is free: the same request now opens a workspace, of all six toolkits.
        out = await ok(c, "workspace_open", request)
        assert {s["name"] for s in out["skills"]} >= {f"kit-{i}" for i in range(1, 7)}, out
        await ok(c, "workspace_close", {"workspace": out["workspace"]})


PARTS = {"progress": progress, "full": full, "bad-input": bad_input, "restart-1": lambda: restart(1), "restart-2": lambda: restart(2), "origin": origin}
started = time.time()
asyncio.run(PARTS[PART]())
print(f"{PART} ({CONFIG['transport']}, {CONFIG['mode']}): ok in {time.time() - started:.1f}s")
