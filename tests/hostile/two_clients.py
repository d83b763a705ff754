#!/usr/bin/env python3
"""Two MCP clients with their own tokens, through the official MCP Python SDK (`mcp`).

    two_clients.py CONFIG_JSON

Alice opens a workspace; Bob, with his own token, tries it through every method the SDK
has: tools, resources and prompts. Every check is an assert; the exit status is the outcome.
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

CONFIG = json.loads(sys.argv[1])


def connect(token):
    headers = {"Authorization": "Bearer " + token}
    target = streamable_http_client(CONFIG["url"], http_client=create_mcp_http_client(headers=headers))
    return Client(target, mode="legacy", read_timeout_seconds=60)


async def main():
    async with connect(CONFIG["alice"]) as alice, connect(CONFIG["bob"]) as bob:
        opened = await alice.call_tool("workspace_open", {"idempotencyKey": "sdk", "toolkits": [CONFIG["toolkit"]]})
        assert not opened.is_error, opened.structured_content
        handle = opened.structured_content["workspace"]
        uri = f"skill://{handle}/shared/SKILL.md"
        mine = [str(r.uri) for r in (await alice.list_resources()).resources]
        assert uri in mine, mine

        for name, args in [
            ("skills_list", {"workspace": handle}),
            ("skills_read", {"workspace": handle, "skill": "shared"}),
            ("skills_run", {"workspace": handle, "skill": "scripted", "script": "scripts/hi.sh"}),
            ("workspace_close", {"workspace": handle}),
        ]:
            r = await bob.call_tool(name, args)
            assert r.is_error and r.structured_content["code"] == "NOT_FOUND", (name, r.structured_content)
            assert r.structured_content["status"] == 404, r.structured_content

        theirs = [str(r.uri) for r in (await bob.list_resources()).resources]
        assert not any(handle in u for u in theirs), theirs
        for attempt in (lambda: bob.read_resource(uri), lambda: bob.get_prompt("session-start", {"workspace": handle})):
            try:
                await attempt()
            except Exception as e:  # the SDK raises the JSON-RPC error
                assert handle not in str(e) or "no open workspace" in str(e) or "no skill resource" in str(e), e
            else:
                raise AssertionError("Bob reached Alice's workspace")

        # Alice's workspace is still hers, whole.
        r = await alice.call_tool("skills_read", {"workspace": handle, "skill": "shared"})
        assert not r.is_error, r.structured_content
        r = await alice.call_tool("workspace_close", {"workspace": handle})
        assert not r.is_error, r.structured_content
    print("two clients: each reached only its own workspace")


asyncio.run(main())
