"""A small MCP tool server: a notes store, for training an agent on MCP tools (see task.py).

Run it alone with `python examples/mcp_notes/server.py` (stdio) or
`python examples/mcp_notes/server.py --http 8200` (Streamable HTTP at http://127.0.0.1:8200/mcp).
Its state (the notes) lives in the process, so each episode gets its own server process over stdio.
"""

from __future__ import annotations

import json
import sys

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("notes")
NOTES: list[str] = []


@server.tool()
def add_note(text: str) -> str:
    """Save a note."""
    if not text.strip():
        raise ToolError("a note needs some text")
    NOTES.append(text.strip())
    return f"saved note {len(NOTES)}"


@server.tool()
def list_notes() -> str:
    """Every note saved so far, oldest first, as a JSON list."""
    return json.dumps(NOTES)


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
