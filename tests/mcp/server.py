"""A real MCP server (the official SDK's MCPServer, 2.x, streamable HTTP)
for the end-to-end tests: two read tools and two write tools. Every tool
call is appended to the file named by MCP_TEST_LOG, so a test can see
exactly what reached the server. `v1/server.py` is the same server on the
1.x SDK (FastMCP).

Usage: python server.py PORT [json|sse]
"""
import json
import os
import sys

from mcp.server.mcpserver import MCPServer

port = int(sys.argv[1])
mode = sys.argv[2] if len(sys.argv) > 2 else "sse"
server = MCPServer("loopgate-test", log_level="WARNING")
log_path = os.environ["MCP_TEST_LOG"]


def record(tool, args):
    with open(log_path, "a") as f:
        f.write(json.dumps({"tool": tool, "args": args}) + "\n")


@server.tool()
def read_file(path: str) -> str:
    """Reads a file."""
    record("read_file", {"path": path})
    return f"contents of {path}"


@server.tool()
def search_docs(query: str) -> str:
    """Searches the docs."""
    record("search_docs", {"query": query})
    return f"3 results for {query}"


@server.tool()
def delete_file(path: str) -> str:
    """Deletes a file."""
    record("delete_file", {"path": path})
    return f"deleted {path}"


@server.tool()
def write_note(text: str) -> str:
    """Writes a note."""
    record("write_note", {"text": text})
    return "saved"


# 2.x takes the address and the response mode at run, not in the constructor.
server.run(transport="streamable-http", host="127.0.0.1", port=port, json_response=(mode == "json"))
