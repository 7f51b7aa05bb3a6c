"""A scripted mock upstream for the SDK tests: the Anthropic Messages API (`POST /v1/messages`)
and OpenAI chat completions (`POST /v1/chat/completions`), streamed as the real APIs stream
them (the gateway's adapters always ask for a stream); and chat completions as an Azure OpenAI
resource serves them (`POST /openai/deployments/{deployment}/chat/completions?api-version=…`),
JSON or streamed, checking the `api-key` header, the api-version and the deployment as Azure
does (a mismatch gets Azure's 401 or 404), with Azure's content-filter results.

Each test queues replies (`push`); requests take them in arrival order and are recorded
(`received`). A reply is a list of blocks: `("text", str)` or `("tool", name, input)`; it
generates `OUTPUT_TOKENS` tokens, and like a real model stops at the max_tokens it is sent
(`within`).
"""

from __future__ import annotations

import json
import shutil
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

UPSTREAM_MODEL = "upstream-model-zq7"
UPSTREAM_KEY = "upstream-secret-key-8812"
# The Azure OpenAI data-plane version the mock serves (as tests/src/upstream.rs).
AZURE_API_VERSION = "2024-10-21"
AZURE_PREFIX = "/openai/deployments/"


# The output tokens every reply counts, when max_tokens leaves room for them.
OUTPUT_TOKENS = 12


def within(blocks: list[tuple], max_tokens: int | None) -> tuple[list[tuple], int, bool]:
    """The reply under the request's max_tokens: (blocks, output tokens, cut). A reply cut
    there keeps at most `max_tokens` characters of text (no token is shorter) and no tool call
    (a generation cut short never completes one)."""
    if max_tokens is None or max_tokens >= OUTPUT_TOKENS:
        return blocks, OUTPUT_TOKENS, False
    kept, left = [], max_tokens
    for block in blocks:
        if block[0] != "text":
            break
        kept.append(("text", block[1][:left]))
        left -= len(kept[-1][1])
    return kept, max_tokens, True


def sent_max_tokens(body: dict) -> int | None:
    """The max_tokens a request sent, in either wire format."""
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if isinstance(value, int) else None


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _sse(data: dict, name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def anthropic_events(blocks: list[tuple], model: str, max_tokens: int | None = None) -> list[bytes]:
    blocks, output_tokens, cut = within(blocks, max_tokens)
    calls_tool = any(b[0] == "tool" for b in blocks)
    stop = "max_tokens" if cut else "tool_use" if calls_tool else "end_turn"
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
    out.append(_sse(delta | {"usage": {"output_tokens": output_tokens}}, "message_delta"))
    out.append(_sse({"type": "message_stop"}, "message_stop"))
    return out


def _azure_filter_results() -> dict:
    safe = {"filtered": False, "severity": "safe"}
    return {"hate": safe, "self_harm": safe, "sexual": safe, "violence": safe}


def azure_refusal(path: str, headers) -> tuple[int, dict] | None:
    """Azure's own checks, in its order: the key (401), then the api-version and the deployment
    (404). `None` when the request passes them."""
    url = urlsplit(path)
    if headers.get("api-key") != UPSTREAM_KEY:
        message = (
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a "
            "valid key for an active subscription and use a correct regional API endpoint for your resource."
        )
        return 401, {"error": {"code": "401", "message": message}}
    if parse_qs(url.query).get("api-version") != [AZURE_API_VERSION]:
        return 404, {"error": {"code": "404", "message": "Resource not found"}}
    if url.path != f"{AZURE_PREFIX}{UPSTREAM_MODEL}/chat/completions":
        message = (
            "The API deployment for this resource does not exist. If you created the deployment "
            "within the last 5 minutes, please wait a moment and try again."
        )
        return 404, {"error": {"code": "DeploymentNotFound", "message": message}}
    return None


def azure_json(blocks: list[tuple], model: str, max_tokens: int | None = None) -> dict:
    """The non-streamed answer, as Azure shapes it: OpenAI's, plus the filter results."""
    blocks, output_tokens, cut = within(blocks, max_tokens)
    text = "".join(b[1] for b in blocks if b[0] == "text")
    calls = [
        {"id": f"call_mock_{i}", "type": "function", "function": {"name": b[1], "arguments": json.dumps(b[2])}}
        for i, b in enumerate(b for b in blocks if b[0] == "tool")
    ]
    message: dict = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    finish = "length" if cut else "tool_calls" if calls else "stop"
    choice = {"index": 0, "message": message, "finish_reason": finish}
    choice["content_filter_results"] = _azure_filter_results()
    return {
        "id": "chatcmpl-mock", "object": "chat.completion", "created": 0, "model": model, "choices": [choice],
        "usage": {"prompt_tokens": 25, "completion_tokens": output_tokens, "total_tokens": 25 + output_tokens},
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": _azure_filter_results()}],
    }


def azure_events(blocks: list[tuple], model: str, include_usage: bool, max_tokens: int | None = None) -> list[bytes]:
    """The stream as Azure sends it: first a chunk with no choices and the prompt's filter
    results, then OpenAI's chunks (the usage chunk only when asked for)."""
    prompt = {"choices": [], "created": 0, "id": "", "model": "", "object": ""}
    prompt["prompt_filter_results"] = [{"prompt_index": 0, "content_filter_results": _azure_filter_results()}]
    events = openai_events(blocks, model, max_tokens)
    if not include_usage:
        events = [e for e in events if b'"usage"' not in e]
    return [_sse(prompt)] + events


def openai_events(blocks: list[tuple], model: str, max_tokens: int | None = None) -> list[bytes]:
    blocks, output_tokens, cut = within(blocks, max_tokens)

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
    finish = "length" if cut else "tool_calls" if tool_index else "stop"
    out.append(chunk([{"index": 0, "delta": {}, "finish_reason": finish}]))
    usage = {"prompt_tokens": 25, "completion_tokens": output_tokens, "total_tokens": 25 + output_tokens}
    out.append(chunk([], usage))
    out.append(b"data: [DONE]\n\n")
    return out


class MockUpstream:
    def __init__(self) -> None:
        self.queue: deque[list[tuple]] = deque()
        self.received: list[tuple[str, dict]] = []
        # The headers of each request, in the same order.
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (the http.server naming)
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"null")
                with mock._lock:
                    mock.received.append((self.path, body))
                    mock.headers.append({k.lower(): v for k, v in self.headers.items()})
                azure = self.path.startswith(AZURE_PREFIX)
                refusal = azure_refusal(self.path, self.headers) if azure else None
                if refusal is not None:
                    # Refused before any model saw it: no scripted reply is taken.
                    self._send(refusal[0], "application/json", [json.dumps(refusal[1]).encode()])
                    return
                with mock._lock:
                    blocks = mock.queue.popleft() if mock.queue else [("text", "Hello from upstream.")]
                model = body.get("model", UPSTREAM_MODEL)
                max_tokens = sent_max_tokens(body)
                if self.path.endswith("/messages"):
                    events = anthropic_events(blocks, model, max_tokens)
                elif azure and not body.get("stream"):
                    answer = azure_json(blocks, UPSTREAM_MODEL, max_tokens)
                    self._send(200, "application/json", [json.dumps(answer).encode()])
                    return
                elif azure:
                    include_usage = (body.get("stream_options") or {}).get("include_usage") is True
                    events = azure_events(blocks, UPSTREAM_MODEL, include_usage, max_tokens)
                else:
                    events = openai_events(blocks, model, max_tokens)
                self._send(200, "text/event-stream", events)

            def _send(self, status: int, content_type: str, parts: list[bytes]) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(sum(len(p) for p in parts)))
                self.end_headers()
                for part in parts:
                    self.wfile.write(part)
                    self.wfile.flush()

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def push(self, *replies: list[tuple]) -> None:
        with self._lock:
            self.queue.extend(replies)

    def last_headers(self) -> dict[str, str]:
        with self._lock:
            return self.headers[-1]

    def last_path(self) -> str:
        with self._lock:
            return self.received[-1][0]

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
    base_url = f"{mock.url}/v1" if provider == "openai" else mock.url
    upstreams = (
        "  upstreams:\n"
        f"    - name: primary\n      provider: {provider}\n      model: {UPSTREAM_MODEL}\n"
        f"      baseUrl: {base_url}\n      apiKeySecretRef:\n        name: mock-upstream-key\n        key: apiKey\n"
    )
    if provider == "azure-openai":
        upstreams += f'      apiVersion: "{AZURE_API_VERSION}"\n'

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
