"""Drives the official MCP Python SDK client, 1.x (`ClientSession` over
`streamablehttp_client`), through Loopgate and prints what it saw as one
JSON object (tests/mcp.rs asserts on it). `../client.py` is the same
client on the current 2.x SDK.

Usage: python client.py GATEWAY_MCP_URL AGENT_KEY OTHER_AGENT_KEY
"""
import asyncio
import json
import sys
from importlib.metadata import version

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError

url, key, other_key = sys.argv[1], sys.argv[2], sys.argv[3]


def error_of(e: McpError):
    data = e.error.data or {}
    return {"code": e.error.code, "message": e.error.message, "loopgate_code": data.get("loopgate_code"), "retryable": data.get("retryable")}


async def main():
    out = {"mcp_version": version("mcp")}
    headers = {"Authorization": f"Bearer {key}", "x-agent-task-id": "sdk-task-1"}
    async with streamablehttp_client(url, headers=headers) as (read, write, session_id):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            out["protocol_version"] = init.protocolVersion
            out["server_name"] = init.serverInfo.name
            tools = await session.list_tools()
            out["tools"] = [t.name for t in tools.tools]
            res = await session.call_tool("read_file", {"path": "/etc/motd"})
            out["read_file"] = res.content[0].text
            try:
                await session.call_tool("delete_file", {"path": "/"})
                out["delete_file"] = "allowed?!"
            except McpError as e:
                out["delete_file"] = error_of(e)
            # The same search three times in one task: the third is a loop.
            loop = []
            for _ in range(3):
                try:
                    r = await session.call_tool("search_docs", {"query": "refund policy"})
                    loop.append(r.content[0].text)
                except McpError as e:
                    loop.append(error_of(e))
            out["loop"] = loop
            sid = session_id()
            out["session_id"] = sid
            # Another agent presenting this session id.
            async with httpx.AsyncClient() as c:
                r = await c.post(
                    url,
                    headers={
                        "Authorization": f"Bearer {other_key}",
                        "mcp-session-id": sid,
                        "content-type": "application/json",
                        "accept": "application/json, text/event-stream",
                    },
                    json={"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {"name": "read_file", "arguments": {"path": "/x"}}},
                )
                out["hijack"] = {"status": r.status_code, "body": r.json()}
    print(json.dumps(out))


asyncio.run(main())
