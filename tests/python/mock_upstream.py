"""A scripted mock upstream for the SDK tests: the Anthropic Messages API (`POST /v1/messages`)
and OpenAI chat completions (`POST /v1/chat/completions`), streamed as the real APIs stream
them (the gateway's adapters always ask for a stream).

Each test queues replies (`push`); requests take them in arrival order and are recorded
(`received`). A reply is a list of blocks: `("text", str)` or `("tool", name, input)`.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

UPSTREAM_MODEL = "upstream-model-zq7"
UPSTREAM_KEY = "upstream-secret-key-8812"


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _sse(data: dict, name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def anthropic_events(blocks: list[tuple], model: str) -> list[bytes]:
    calls_tool = any(b[0] == "tool" for b in blocks)
    stop = "tool_use" if calls_tool else "end_turn"
    usage = {"input_tokens": 25, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    message = {"id": "msg_mock", "type": "message", "role": "assistant", "model": model, "content": []}
    message |= {"stop_reason": None, "stop_sequence": None, "usage": usage}
    out = [_sse({"type": "message_start", "message": message}, "message_start"), _sse({"type": "ping"}, "ping")]
    for index, block in enumerate(blocks):
        if block[0] == "text":
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in _pieces(block[1], 6)]
        else:
            start = {"type": "tool_use", "id": f"toolu_mock_{index}", "name": block[1], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in _pieces(json.dumps(block[2]), 5)]
        out.append(_sse({"type": "content_block_start", "index": index, "content_block": start}, "content_block_start"))
        for delta in deltas:
            out.append(_sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"))
        out.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    delta = {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}}
    out.append(_sse(delta | {"usage": {"output_tokens": 12}}, "message_delta"))
    out.append(_sse({"type": "message_stop"}, "message_stop"))
    return out


def openai_events(blocks: list[tuple], model: str) -> list[bytes]:
    def chunk(choices: list, usage: dict | None = None) -> bytes:
        body = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0, "model": model}
        body |= {"choices": choices}
        if usage is not None:
            body["usage"] = usage
        return _sse(body)

    def delta(d: dict) -> bytes:
        return chunk([{"index": 0, "delta": d, "finish_reason": None}])

    out = [delta({"role": "assistant", "content": ""})]
    tool_index = 0
    for block in blocks:
        if block[0] == "text":
            out += [delta({"content": p}) for p in _pieces(block[1], 6)]
        else:
            call = {"index": tool_index, "id": f"call_mock_{tool_index}", "type": "function"}
            out.append(delta({"tool_calls": [call | {"function": {"name": block[1], "arguments": ""}}]}))
            for p in _pieces(json.dumps(block[2]), 5):
                out.append(delta({"tool_calls": [{"index": tool_index, "function": {"arguments": p}}]}))
            tool_index += 1
    finish = "tool_calls" if tool_index else "stop"
    out.append(chunk([{"index": 0, "delta": {}, "finish_reason": finish}]))
    out.append(chunk([], {"prompt_tokens": 25, "completion_tokens": 12, "total_tokens": 37}))
    out.append(b"data: [DONE]\n\n")
    return out


class MockUpstream:
    def __init__(self) -> None:
        self.queue: deque[list[tuple]] = deque()
        self.received: list[tuple[str, dict]] = []
        self._lock = threading.Lock()
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (the http.server naming)
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"null")
                with mock._lock:
                    mock.received.append((self.path, body))
                    blocks = mock.queue.popleft() if mock.queue else [("text", "Hello from upstream.")]
                model = body.get("model", UPSTREAM_MODEL)
                if self.path.endswith("/messages"):
                    events = anthropic_events(blocks, model)
                else:
                    events = openai_events(blocks, model)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(sum(len(e) for e in events)))
                self.end_headers()
                for event in events:
                    self.wfile.write(event)
                    self.wfile.flush()

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def push(self, *replies: list[tuple]) -> None:
        with self._lock:
            self.queue.extend(replies)

    def last_body(self) -> dict:
        with self._lock:
            return self.received[-1][1]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def routed_manifests(repo_root: Path, target: Path, provider: str, mock: MockUpstream) -> Path:
    """A manifest folder: the standalone tiers and keys, every model routed to `mock`."""
    target.mkdir(parents=True, exist_ok=True)
    standalone = repo_root / "deploy" / "standalone"
    for name in ("tiers.yaml", "apikeys.yaml"):
        shutil.copy(standalone / name, target / name)
    base_url = mock.url if provider == "anthropic" else f"{mock.url}/v1"
    upstreams = (
        "  upstreams:\n"
        f"    - name: primary\n      provider: {provider}\n      model: {UPSTREAM_MODEL}\n"
        f"      baseUrl: {base_url}\n      apiKeySecretRef:\n        name: mock-upstream-key\n        key: apiKey\n"
    )
    lines, skipping = [], False
    for line in (standalone / "models.yaml").read_text().splitlines():
        if line == "  upstreams:":
            lines.append(upstreams.rstrip("\n"))
            skipping = True
            continue
        if skipping and line.startswith("    "):
            continue
        skipping = False
        lines.append(line)
    (target / "models.yaml").write_text("\n".join(lines) + "\n")
    secret = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: mock-upstream-key\ntype: Opaque\n"
    (target / "secrets.yaml").write_text(secret + f"stringData:\n  apiKey: {UPSTREAM_KEY}\n")
    return target


def carries_tool_output(body: dict, output: str) -> bool:
    """Whether an upstream request (either wire format) carries `output` back as a tool's result."""
    for message in body.get("messages", []):
        content = message.get("content")
        if message.get("role") == "tool" and output in str(content):
            return True
        if isinstance(content, list) and any(
            b.get("type") == "tool_result" and output in str(b.get("content")) for b in content
        ):
            return True
    return False
