"""A long session of the official MCP Python SDK client through Loopgate:
it initializes (the SDK then opens the server's own GET stream and leaves
it silent), waits IDLE seconds (several of the gateway's stream idle
limits), then calls a tool three times. Prints what it saw as one JSON
object (tests/mcp.rs asserts on it).

Usage: python3 long_session.py GATEWAY_MCP_URL AGENT_KEY IDLE_SECONDS
"""
import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError

url, key, idle = sys.argv[1], sys.argv[2], float(sys.argv[3])


async def main():
    out = {"calls": []}
    headers = {"Authorization": f"Bearer {key}"}
    async with streamablehttp_client(url, headers=headers) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            await asyncio.sleep(idle)
            for i in range(3):
                try:
                    r = await session.call_tool("read_file", {"path": f"/after-idle-{i}"})
                    out["calls"].append(r.content[0].text)
                except McpError as e:
                    data = e.error.data or {}
                    out["calls"].append({"error": data.get("loopgate_code") or e.error.message})
    print(json.dumps(out))


asyncio.run(main())
