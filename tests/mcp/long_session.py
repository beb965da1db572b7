"""A long session of the official MCP Python SDK client (2.x, `mcp.Client`
in its default `auto` mode) through Loopgate: it connects (the SDK then
opens the server's own GET stream and leaves it silent), waits IDLE
seconds (several of the gateway's stream idle limits), then calls a tool
three times. Prints what it saw as one JSON object (tests/mcp.rs asserts
on it).

Usage: python long_session.py GATEWAY_MCP_URL AGENT_KEY IDLE_SECONDS
"""
import asyncio
import json
import sys
from importlib.metadata import version

import httpx2
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

url, key, idle = sys.argv[1], sys.argv[2], float(sys.argv[3])


async def main():
    out = {"mcp_version": version("mcp"), "calls": []}
    # The SDK's own read timeout for a server stream (300 s), not httpx2's 5 s.
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30, read=300))
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        out["protocol_version"] = client.protocol_version
        await asyncio.sleep(idle)
        for i in range(3):
            try:
                r = await client.call_tool("read_file", {"path": f"/after-idle-{i}"})
                out["calls"].append(r.content[0].text)
            except MCPError as e:
                data = e.error.data or {}
                out["calls"].append({"error": data.get("loopgate_code") or e.error.message})
    print(json.dumps(out))


asyncio.run(main())
