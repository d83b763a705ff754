"""The installed server, as an agent platform and a scraper see it: a workspace_open of the
built-in tier with the MCP Python SDK, then /metrics parsed. Arguments: URL, token."""
import asyncio
import sys
import urllib.request

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

BASE, TOKEN = sys.argv[1], sys.argv[2]
AUTH = {"Authorization": "Bearer " + TOKEN}


async def agent():
    http = create_mcp_http_client(headers=AUTH)
    async with Client(streamable_http_client(BASE + "/mcp", http_client=http), read_timeout_seconds=60) as c:
        opened = await c.call_tool("workspace_open", {"idempotencyKey": "packaged", "toolkits": []})
        assert not opened.is_error, opened.structured_content
        ws = opened.structured_content["workspace"]
        listed = await c.call_tool("skills_list", {"workspace": ws})
        names = sorted(s["name"] for s in listed.structured_content["skills"])
        assert "cloud-harness-skills" in names, names
        print(f"mcp: workspace {ws} serves {len(names)} built-in skills")
        return ws


async def close(ws):
    """Closed, so its executor (a container, when an engine answers) goes with it."""
    http = create_mcp_http_client(headers=AUTH)
    async with Client(streamable_http_client(BASE + "/mcp", http_client=http), read_timeout_seconds=60) as c:
        closed = await c.call_tool("workspace_close", {"workspace": ws})
        assert not closed.is_error, closed.structured_content


ws = asyncio.run(agent())

# Every sample line is `name{labels} value`; the open shows in the series it moved.
req = urllib.request.Request(BASE + "/metrics", headers=AUTH)
text = urllib.request.urlopen(req, timeout=10).read().decode()
samples = {}
for line in text.splitlines():
    if line.startswith("#") or not line:
        continue
    series, value = line.rsplit(" ", 1)
    samples[series] = float(value)
calls = samples.get('cloud_harness_mcp_calls_total{tool="workspace_open",code="OK"}')
assert calls == 1.0, text
assert samples.get("cloud_harness_open_workspaces") == 1.0, text
assert text.rstrip().endswith("# EOF"), text[-200:]
print(f"metrics: {len(samples)} samples parsed")
asyncio.run(close(ws))
