"""Constants and helpers shared by the SDK conformance tests (plain functions, no fixtures)."""

from __future__ import annotations

import struct
import time
import zlib

# Plenty of credits: $100 at the default 100,000 credits per USD.
RICH_CREDITS = 10_000_000

VIRTUAL_MODELS = {"svc/auto", "svc/opus", "svc/sonnet", "svc/kimi", "svc/haiku"}
# Listed beside them, serving /v1/embeddings only (`capabilities.embeddings`).
EMBEDDING_MODELS = {"svc/embed"}

# The simulated provider answers `This is a simulated reply from <model>. You said: <last user text>`.
SIMULATED_PREFIX = "This is a simulated reply from "


def said(last_user_text: str) -> str:
    """The tail of every simulated reply to `last_user_text`."""
    return f"You said: {last_user_text}"


# A tool whose required properties the simulated provider fills from the schema:
# string -> "simulated", integer -> 1, boolean -> true.
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "description": "Forecast length"},
        "metric": {"type": "boolean"},
        "note": {"type": "string", "description": "Not required, so never filled"},
    },
    "required": ["city", "days", "metric"],
}
WEATHER_INPUT = {"city": "simulated", "days": 1, "metric": True}
TOOL_RESULT_TEXT = "22 degrees and sunny"


def tiny_png(width: int = 4, height: int = 4) -> bytes:
    """A valid RGB PNG, built by hand (signature, IHDR, IDAT, IEND)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    rows = b"".join(b"\x00" + bytes([200, 30, 30]) * width for _ in range(height))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def requests_used_in_a_fresh_window(send_raw, margin_s: int = 5) -> int:
    """Sends one request (`send_raw()` returns something with `.headers`) and, when the key's
    fixed minute window resets within `margin_s` seconds, waits for the reset so the requests
    that follow all land in one window. Returns how many requests of that window are used."""
    reset = int(send_raw().headers["x-ratelimit-reset-requests"])
    if reset < margin_s:
        time.sleep(reset + 1)
        return 0
    return 1
