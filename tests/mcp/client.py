"""Drives the official MCP Python SDK client (2.x, `mcp.Client` in its
default `auto` mode) through Loopgate and prints what it saw as one JSON
object (tests/mcp.rs asserts on it). `v1/client.py` is the same client on
the 1.x SDK.

Usage: python client.py GATEWAY_MCP_URL AGENT_KEY OTHER_AGENT_KEY
"""
import asyncio
import json
import sys
from importlib.metadata import version

import httpx2
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

url, key, other_key = sys.argv[1], sys.argv[2], sys.argv[3]


def error_of(e: MCPError):
    data = e.error.data or {}
    return {"code": e.error.code, "message": e.error.message, "loopgate_code": data.get("loopgate_code"), "retryable": data.get("retryable")}


async def main():
    out = {"mcp_version": version("mcp")}
    # 2.x has no session-id getter: the session id is read off the answers.
    session_ids = []

    async def remember_session(response):
        sid = response.headers.get("mcp-session-id")
        if sid:
            session_ids.append(sid)

    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {key}", "x-agent-task-id": "sdk-task-1"},
        timeout=httpx2.Timeout(30, read=300),
        event_hooks={"response": [remember_session]},
    )
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        out["protocol_version"] = client.protocol_version
        out["server_name"] = client.server_info.name
        tools = await client.list_tools()
        out["tools"] = [t.name for t in tools.tools]
        res = await client.call_tool("read_file", {"path": "/etc/motd"})
        out["read_file"] = res.content[0].text
        try:
            await client.call_tool("delete_file", {"path": "/"})
            out["delete_file"] = "allowed?!"
        except MCPError as e:
            out["delete_file"] = error_of(e)
        # The same search three times in one task: the third is a loop.
        loop = []
        for _ in range(3):
            try:
                r = await client.call_tool("search_docs", {"query": "refund policy"})
                loop.append(r.content[0].text)
            except MCPError as e:
                loop.append(error_of(e))
        out["loop"] = loop
        sid = session_ids[-1]
        out["session_id"] = sid
        # Another agent presenting this session id.
        async with httpx2.AsyncClient() as c:
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
