"""A scripted mock upstream for the SDK tests: the Anthropic Messages API (`POST /v1/messages`)
and OpenAI chat completions (`POST /v1/chat/completions`), streamed as the real APIs stream
them (the gateway's adapters always ask for a stream); and chat completions as an Azure OpenAI
resource serves them (`POST /openai/deployments/{deployment}/chat/completions?api-version=…`),
JSON or streamed, checking the `api-key` header, the api-version and the deployment as Azure
does (a mismatch gets Azure's 401 or 404), with Azure's content-filter results; and Claude on
Amazon Bedrock (`POST /model/{modelId}/invoke`, JSON, and `/invoke-with-response-stream`, the AWS
event stream with its prelude and message CRCs), which recomputes each request's SigV4 signature
with botocore's `SigV4Auth` from the known test keys and refuses a mismatch with Bedrock's 403
`InvalidSignatureException`, as `tests/src/bedrock.rs` does; the Gemini API
(`POST /v1beta/models/{model}:generateContent`, JSON, and `:streamGenerateContent?alt=sse`), which
checks the `x-goog-api-key` header (none: Google's 403 `PERMISSION_DENIED`; a wrong one: its 400
`API_KEY_INVALID`), the model and the body's shape (unknown fields, roles, parts with one datum,
schema types) and refuses a mismatch with Google's error JSON, as `tests/src/gemini.rs` does; and
Claude on Google Vertex AI (`POST /v1/projects/{p}/locations/{r}/publishers/anthropic/models/
{model}:streamRawPredict`, the Messages SSE, and `:rawPredict`, JSON) with Google's token
endpoints, as `tests/src/vertex.rs`: `POST /token` verifies the service account's RS256 JWT
(PyJWT on `cryptography`, against the public half of the key pair the mock generates when it
starts), its audience, issuer, scope and expiry, and refuses a bad one with Google's 400
`invalid_grant`; the metadata server's token wants `Metadata-Flavor: Google`; Vertex refuses a
missing, unknown or expired bearer token with 401 `UNAUTHENTICATED`. Both OpenAI formats also
serve embeddings (`POST /v1/embeddings`, `/openai/deployments/{deployment}/embeddings`) as OpenAI
does: one vector per input of the request's `dimensions` (8 by default), float or base64, and
`EMBEDDING_TOKENS_PER_INPUT` prompt tokens per input (as tests/src/upstream.rs).

Each test queues replies (`push`); requests take them in arrival order and are recorded
(`received`). A reply is a list of blocks: `("text", str)` or `("tool", name, input)`; it
generates `OUTPUT_TOKENS` tokens, and like a real model stops at the max_tokens it is sent
(`within`).
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import struct
import threading
import time
import zlib
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

UPSTREAM_MODEL = "upstream-model-zq7"
UPSTREAM_KEY = "upstream-secret-key-8812"
# The Azure OpenAI data-plane version the mock serves (as tests/src/upstream.rs).
AZURE_API_VERSION = "2024-10-21"
AZURE_PREFIX = "/openai/deployments/"
# Bedrock, as tests/src/bedrock.rs.
BEDROCK_REGION = "eu-west-3"
BEDROCK_MODEL_ID = "anthropic.upstream-model-zq7-v1:0"
AWS_ACCESS_KEY_ID = "AKIAMOCKBEDROCK00001"
AWS_SECRET_ACCESS_KEY = "upstream-secret-key-aws/Zq7mock+bedrock"
AWS_SESSION_TOKEN = "mock-session-token-8812"
BEDROCK_PREFIX = "/model/"
# The Gemini API, as tests/src/gemini.rs.
GEMINI_PREFIX = "/v1beta/models/"


# The prompt tokens the mocks report per embeddings input, whatever its text.
EMBEDDING_TOKENS_PER_INPUT = 7


def embeddings_json(body: dict) -> tuple[int, dict]:
    """OpenAI's embeddings answer: each input's vector is its index and length, repeated to
    `dimensions`; base64 is the little-endian float32 bytes."""
    given = body.get("input")
    inputs = [given] if isinstance(given, str) else given if isinstance(given, list) else []
    if not inputs or not all(isinstance(i, str) for i in inputs):
        return 400, {"error": {"message": "openai: '$.input' is invalid", "type": "invalid_request_error"}}
    dimensions = body.get("dimensions") or 8
    data = []
    for index, text in enumerate(inputs):
        vector = [float(index) if d % 2 == 0 else float(len(text)) for d in range(dimensions)]
        if body.get("encoding_format") == "base64":
            embedding = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode("ascii")
        else:
            embedding = vector
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = EMBEDDING_TOKENS_PER_INPUT * len(inputs)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return 200, {"object": "list", "data": data, "model": body.get("model", UPSTREAM_MODEL), "usage": usage}
# Vertex AI, as tests/src/vertex.rs.
VERTEX_REGION = "us-east5"
VERTEX_PROJECT = "mock-project-zq7"
VERTEX_MODEL_ID = "upstream-model-zq7@20250101"
VERTEX_VERSION = "vertex-2023-10-16"
VERTEX_PREFIX = "/v1/projects/"
GOOGLE_CLIENT_EMAIL = "gateway@mock-project-zq7.iam.gserviceaccount.com"
GOOGLE_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
METADATA_TOKEN = "/computeMetadata/v1/instance/service-accounts/default/token"


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
    """The max_tokens a request sent, in any wire format."""
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None and isinstance(body.get("generationConfig"), dict):
        value = body["generationConfig"].get("maxOutputTokens")
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
    if url.path not in (f"{AZURE_PREFIX}{UPSTREAM_MODEL}/chat/completions", f"{AZURE_PREFIX}{UPSTREAM_MODEL}/embeddings"):
        message = (
            "The API deployment for this resource does not exist. If you created the deployment "
            "within the last 5 minutes, please wait a moment and try again."
        )
        return 404, {"error": {"code": "DeploymentNotFound", "message": message}}
    return None


def _bedrock_error(status: int, kind: str, message: str) -> tuple[int, dict, dict]:
    error_type = f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"
    return status, {"message": f"bedrock: {message}"}, {"x-amzn-errortype": error_type}


def bedrock_refusal(path: str, headers, raw: bytes, body) -> tuple[int, dict, dict] | None:
    """Bedrock's checks: the SigV4 signature (recomputed with botocore from what arrived), then the
    model id and the body. `None` when the request passes them."""
    authorization = headers.get("authorization", "")
    if not authorization.startswith("AWS4-HMAC-SHA256 "):
        return _bedrock_error(403, "MissingAuthenticationTokenException", "Missing Authentication Token")
    fields = dict(f.split("=", 1) for f in authorization.removeprefix("AWS4-HMAC-SHA256 ").split(", ") if "=" in f)
    scope = fields.get("Credential", "").split("/")
    token = headers.get("x-amz-security-token")
    if scope[0] != AWS_ACCESS_KEY_ID or (token is not None and token != AWS_SESSION_TOKEN):
        message = "The security token included in the request is invalid."
        return _bedrock_error(403, "UnrecognizedClientException", message)
    if scope[2:4] != [BEDROCK_REGION, "bedrock"]:
        message = f"Credential should be scoped to a valid region: {scope}"
        return _bedrock_error(403, "InvalidSignatureException", message)
    signed = fields.get("SignedHeaders", "").split(";")
    request = botocore.awsrequest.AWSRequest(
        method="POST",
        url=f"http://{headers.get('host')}{path}",
        data=raw,
        headers={name: headers.get(name, "") for name in signed},
    )
    request.context["timestamp"] = headers.get("x-amz-date", "")
    credentials = botocore.credentials.Credentials(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, token)
    auth = botocore.auth.SigV4Auth(credentials, "bedrock", BEDROCK_REGION)
    canonical = auth.canonical_request(request)
    expected = auth.signature(auth.string_to_sign(request, canonical), request)
    if "host" not in signed or expected != fields.get("Signature"):
        message = "The request signature we calculated does not match the signature you provided."
        return _bedrock_error(403, "InvalidSignatureException", message)
    model = unquote(path.removeprefix(BEDROCK_PREFIX).split("/", 1)[0])
    if model != BEDROCK_MODEL_ID:
        return _bedrock_error(400, "ValidationException", "The provided model identifier is invalid.")
    for key in ("model", "stream", "metadata"):
        if key in body:
            message = f"Malformed input request: extraneous key [{key}] is not permitted"
            return _bedrock_error(400, "ValidationException", message)
    if not body.get("anthropic_version"):
        return _bedrock_error(400, "ValidationException", "Malformed input request: anthropic_version is required")
    return None


def gemini_error(status: int, message: str, details: list | None = None) -> tuple[int, dict]:
    names = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED"}
    error = {"code": status, "message": f"gemini: {message}", "status": names.get(status, "UNKNOWN")}
    return status, {"error": error | {"details": details or []}}


_GEMINI_REQUEST = {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "safetySettings"}
_GEMINI_PART_DATA = {"text", "inlineData", "functionCall", "functionResponse", "fileData"}
_GEMINI_SCHEMA = {
    "type", "format", "title", "description", "nullable", "enum", "maxItems", "minItems", "properties",
    "required", "minProperties", "maxProperties", "minLength", "maxLength", "pattern", "example", "anyOf",
    "propertyOrdering", "default", "items", "minimum", "maximum",
}  # fmt: skip
_GEMINI_TYPES = {"STRING", "NUMBER", "INTEGER", "BOOLEAN", "ARRAY", "OBJECT", "NULL"}


def _gemini_schema_problem(schema, at: str) -> str | None:
    if not isinstance(schema, dict):
        return f"Invalid value at '{at}'"
    for key in schema:
        if key not in _GEMINI_SCHEMA:
            return f'Invalid JSON payload received. Unknown name "{key}" at \'{at}\': Cannot find field.'
    if "type" in schema and str(schema["type"]).upper() not in _GEMINI_TYPES:
        return f"Invalid value at '{at}.type' ({schema['type']})"
    nested = [(f"{at}.properties[{k}]", v) for k, v in (schema.get("properties") or {}).items()]
    nested += [(f"{at}.items", schema["items"])] if "items" in schema else []
    nested += [(f"{at}.any_of[{i}]", v) for i, v in enumerate(schema.get("anyOf") or [])]
    return next((p for p in (_gemini_schema_problem(v, a) for a, v in nested) if p), None)


def gemini_malformed(body) -> str | None:
    """What Google would refuse in a GenerateContentRequest, if anything."""
    if not isinstance(body, dict):
        return "Invalid JSON payload received."
    unknown = set(body) - _GEMINI_REQUEST
    if unknown:
        return f'Invalid JSON payload received. Unknown name "{sorted(unknown)[0]}": Cannot find field.'
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return "* GenerateContentRequest.contents: contents is not specified"
    for i, content in enumerate(contents):
        if content.get("role") not in ("user", "model"):
            return f"* GenerateContentRequest.contents[{i}].role: Please use a valid role: user, model."
        parts = content.get("parts")
        if not isinstance(parts, list) or not parts:
            return f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."
        for j, part in enumerate(parts):
            if len(_GEMINI_PART_DATA & set(part)) != 1:
                return f"* GenerateContentRequest.contents[{i}].parts[{j}].data: required oneof field 'data'"
    for t, tool in enumerate(body.get("tools") or []):
        for f, declaration in enumerate(tool.get("functionDeclarations") or []):
            if "parameters" in declaration:
                at = f"tools[{t}].function_declarations[{f}].parameters"
                problem = _gemini_schema_problem(declaration["parameters"], at)
                if problem:
                    return problem
    return None


def gemini_refusal(path: str, headers, body) -> tuple[int, dict] | None:
    """Google's checks, in its order: the key, the model and method, then the body."""
    url = urlsplit(path)
    key = headers.get("x-goog-api-key") or (parse_qs(url.query).get("key") or [None])[0]
    if key is None:
        return gemini_error(403, "Method doesn't allow unregistered callers (callers without established identity).")
    if key != UPSTREAM_KEY:
        reason = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}
        return gemini_error(400, "API key not valid. Please pass a valid API key.", [reason])
    model, _, method = url.path.removeprefix(GEMINI_PREFIX).partition(":")
    if model != UPSTREAM_MODEL or method not in ("generateContent", "streamGenerateContent"):
        return gemini_error(404, f"models/{model} is not found for API version v1beta")
    if method == "streamGenerateContent" and parse_qs(url.query).get("alt") != ["sse"]:
        return gemini_error(400, "the mock streams with alt=sse only")
    problem = gemini_malformed(body)
    return gemini_error(400, problem) if problem else None


def _gemini_parts(blocks: list[tuple]) -> list[dict]:
    return [
        {"text": b[1]} if b[0] == "text" else {"functionCall": {"name": b[1], "args": b[2]}} for b in blocks
    ]


def gemini_json(blocks: list[tuple], max_tokens: int | None = None) -> dict:
    blocks, output_tokens, cut = within(blocks, max_tokens)
    candidate = {"content": {"role": "model", "parts": _gemini_parts(blocks)}, "index": 0}
    candidate["finishReason"] = "MAX_TOKENS" if cut else "STOP"
    usage = {"promptTokenCount": 25, "candidatesTokenCount": output_tokens, "totalTokenCount": 25 + output_tokens}
    return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": UPSTREAM_MODEL}


def gemini_events(blocks: list[tuple], max_tokens: int | None = None) -> list[bytes]:
    """The stream: text in pieces, a function call whole, the finish reason and usage last."""
    whole = gemini_json(blocks, max_tokens)
    candidate = whole["candidates"][0]
    out = []
    for part in candidate["content"]["parts"]:
        pieces = [{"text": p} for p in _pieces(part["text"], 6)] if "text" in part else [part]
        for piece in pieces:
            content = {"role": "model", "parts": [piece]}
            out.append(_sse({"candidates": [{"content": content, "index": 0}], "modelVersion": UPSTREAM_MODEL}))
    last = {"content": {"role": "model", "parts": [{"text": ""}]}, "index": 0}
    last["finishReason"] = candidate["finishReason"]
    out.append(_sse({"candidates": [last], "usageMetadata": whole["usageMetadata"], "modelVersion": UPSTREAM_MODEL}))
    return out
def private_pem(key: rsa.RSAPrivateKey) -> str:
    """A private key as a service account's key file holds it (PKCS#8 PEM)."""
    pkcs8 = serialization.PrivateFormat.PKCS8
    return key.private_bytes(serialization.Encoding.PEM, pkcs8, serialization.NoEncryption()).decode()


def _google_error(status: int, state: str, message: str) -> tuple[int, dict]:
    return status, {"error": {"code": status, "status": state, "message": f"vertex (google): {message}"}}


def _is_dated(version: str) -> bool:
    return len(version) == 10 and all(c == "-" if i in (4, 7) else c.isdigit() for i, c in enumerate(version))


def _frame(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event-stream message: prelude (lengths, CRC), string headers, payload, CRC."""
    encoded = b"".join(
        struct.pack(">B", len(name)) + name.encode() + struct.pack(">BH", 7, len(value)) + value.encode()
        for name, value in headers.items()
    )
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack(">II", total, len(encoded))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    return message + struct.pack(">I", zlib.crc32(message))


def bedrock_frames(sse_events: list[bytes]) -> list[bytes]:
    """The Messages stream's events as Bedrock's `chunk` frames, the last with its invocation metrics."""
    out = []
    for i, event in enumerate(sse_events):
        data = json.loads(next(line for line in event.decode().splitlines() if line.startswith("data: "))[6:])
        if i == len(sse_events) - 1:
            data["amazon-bedrock-invocationMetrics"] = {"inputTokenCount": 25, "outputTokenCount": 12}
        chunk = {"bytes": base64.b64encode(json.dumps(data).encode()).decode(), "p": "abcdefgh"}
        headers = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}
        out.append(_frame(headers, json.dumps(chunk).encode()))
    return out


def anthropic_json(blocks: list[tuple], model: str, max_tokens: int | None = None) -> dict:
    blocks, output_tokens, cut = within(blocks, max_tokens)
    content = [
        {"type": "text", "text": b[1]}
        if b[0] == "text"
        else {"type": "tool_use", "id": f"toolu_mock_{i}", "name": b[1], "input": b[2]}
        for i, b in enumerate(blocks)
    ]
    stop = "max_tokens" if cut else "tool_use" if any(b[0] == "tool" for b in blocks) else "end_turn"
    return {
        "id": "msg_mock", "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 25, "output_tokens": output_tokens},
    }


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
        # The test service account's key pair, made for this mock (no key is kept in the repository).
        self.google_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        # Access token -> expiry (epoch seconds); and the grants of each kind.
        self.tokens: dict[str, float] = {}
        self.token_grants = {"key_file": 0, "metadata": 0, "refused": 0}
        mock = self

        def grant(kind: str) -> dict:
            token = f"ya29.mock-{kind}-{secrets.token_hex(8)}"
            with mock._lock:
                mock.tokens[token] = time.time() + 3599
                mock.token_grants[kind] += 1
            return {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}

        def token_refusal(raw: bytes, host: str) -> dict | None:
            """Google's checks of a service account's JWT bearer grant; `None` when it passes."""
            form = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
            if form.get("grant_type") != JWT_BEARER:
                return {"error": "unsupported_grant_type", "error_description": "google oauth2: Invalid grant_type"}
            try:
                claims = jwt.decode(
                    form.get("assertion", ""),
                    mock.google_key.public_key(),
                    algorithms=["RS256"],
                    audience=f"http://{host}/token",
                    issuer=GOOGLE_CLIENT_EMAIL,
                    options={"require": ["exp", "iat", "aud", "iss"]},
                )
            except jwt.InvalidTokenError as e:
                description = f"google oauth2: Invalid JWT: {type(e).__name__}"
                return {"error": "invalid_grant", "error_description": description}
            if claims["exp"] - claims["iat"] > 3600 or GOOGLE_SCOPE not in str(claims.get("scope", "")).split():
                return {"error": "invalid_grant", "error_description": "google oauth2: Invalid JWT claims"}
            return None

        def vertex_refusal(path: str, headers, body) -> tuple[int, dict] | None:
            """Vertex's checks: the bearer token, the project and region, the model, the body."""
            token = headers.get("authorization", "").removeprefix("Bearer ")
            with mock._lock:
                valid = mock.tokens.get(token, 0) > time.time()
            if not valid:
                return _google_error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
            parts = path.split("?")[0].strip("/").split("/")
            if parts[2:3] != [VERTEX_PROJECT] or parts[4:5] != [VERTEX_REGION]:
                return _google_error(403, "PERMISSION_DENIED", "Permission 'aiplatform.endpoints.predict' denied")
            model = unquote(parts[-1].rpartition(":")[0])
            if parts[5:7] != ["publishers", "anthropic"] or model != VERTEX_MODEL_ID:
                return _google_error(404, "NOT_FOUND", "Publisher Model was not found")
            if "model" in body:
                return _google_error(400, "INVALID_ARGUMENT", "model: Extra inputs are not permitted")
            version = body.get("anthropic_version", "")
            if version != VERTEX_VERSION and not _is_dated(version):
                return _google_error(400, "INVALID_ARGUMENT", f"anthropic_version: Input should be '{VERTEX_VERSION}'")
            return None

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (the http.server naming)
                if self.path != METADATA_TOKEN or self.headers.get("metadata-flavor") != "Google":
                    with mock._lock:
                        mock.token_grants["refused"] += 1
                    self._send(403, "text/plain", [b"google metadata: Missing required header: Metadata-Flavor"])
                    return
                self._send(200, "application/json", [json.dumps(grant("metadata")).encode()])

            def do_POST(self) -> None:  # noqa: N802 (the http.server naming)
                raw = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path == "/token":
                    refused = token_refusal(raw, self.headers.get("host", ""))
                    if refused is not None:
                        with mock._lock:
                            mock.token_grants["refused"] += 1
                        self._send(400, "application/json", [json.dumps(refused).encode()])
                        return
                    self._send(200, "application/json", [json.dumps(grant("key_file")).encode()])
                    return
                body = json.loads(raw or b"null")
                with mock._lock:
                    mock.received.append((self.path, body))
                    mock.headers.append({k.lower(): v for k, v in self.headers.items()})
                azure = self.path.startswith(AZURE_PREFIX)
                bedrock = self.path.startswith(BEDROCK_PREFIX)
                vertex = self.path.startswith(VERTEX_PREFIX)
                refusal = azure_refusal(self.path, self.headers) if azure else None
                gemini = self.path.startswith(GEMINI_PREFIX)
                if gemini:
                    refusal = gemini_refusal(self.path, self.headers, body)
                if vertex:
                    refusal = vertex_refusal(self.path, self.headers, body)
                if bedrock:
                    refused = bedrock_refusal(self.path, self.headers, raw, body)
                    if refused is not None:
                        status, error, headers = refused
                        self._send(status, "application/json", [json.dumps(error).encode()], headers)
                        return
                if refusal is not None:
                    # Refused before any model saw it: no scripted reply is taken.
                    self._send(refusal[0], "application/json", [json.dumps(refusal[1]).encode()])
                    return
                if urlsplit(self.path).path.endswith("/embeddings"):
                    status, answer = embeddings_json(body)
                    self._send(status, "application/json", [json.dumps(answer).encode()])
                    return
                with mock._lock:
                    blocks = mock.queue.popleft() if mock.queue else [("text", "Hello from upstream.")]
                model = body.get("model", UPSTREAM_MODEL)
                max_tokens = sent_max_tokens(body)
                chunks_type = {"x-amzn-bedrock-content-type": "application/json"}
                if bedrock and self.path.endswith("/invoke"):
                    answer = json.dumps(anthropic_json(blocks, UPSTREAM_MODEL, max_tokens)).encode()
                    self._send(200, "application/json", [answer], chunks_type)
                    return
                if bedrock:
                    frames = bedrock_frames(anthropic_events(blocks, UPSTREAM_MODEL, max_tokens))
                    self._send(200, "application/vnd.amazon.eventstream", frames, chunks_type)
                    return
                if gemini and ":streamGenerateContent" not in self.path:
                    self._send(200, "application/json", [json.dumps(gemini_json(blocks, max_tokens)).encode()])
                    return
                if gemini:
                    self._send(200, "text/event-stream", gemini_events(blocks, max_tokens))
                    return
                if vertex and self.path.endswith(":rawPredict"):
                    answer = json.dumps(anthropic_json(blocks, UPSTREAM_MODEL, max_tokens)).encode()
                    self._send(200, "application/json", [answer])
                    return
                if vertex:
                    events = anthropic_events(blocks, UPSTREAM_MODEL, max_tokens)
                elif self.path.endswith("/messages"):
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

            def _send(self, status: int, content_type: str, parts: list[bytes], headers: dict | None = None) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
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

    def key_file(self, *, key: rsa.RSAPrivateKey | None = None) -> dict:
        """A service account's JSON key file whose `token_uri` is this mock's (with its key, or another)."""
        return {
            "type": "service_account",
            "project_id": VERTEX_PROJECT,
            "private_key_id": "0123456789abcdef0123456789abcdef01234567",
            "private_key": private_pem(key or self.google_key),
            "client_email": GOOGLE_CLIENT_EMAIL,
            "client_id": "100000000000000000001",
            "token_uri": f"{self.url}/token",
        }

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
    if provider == "bedrock":
        model = f'"{BEDROCK_MODEL_ID}"'
        credentials = (
            f"      region: {BEDROCK_REGION}\n      awsCredentialsSecretRef:\n        name: mock-aws-credentials\n"
        )
    elif provider == "vertex":
        model = f'"{VERTEX_MODEL_ID}"'
        credentials = (
            f"      region: {VERTEX_REGION}\n      project: {VERTEX_PROJECT}\n"
            "      googleCredentialsSecretRef:\n        name: mock-google-sa\n        key: key.json\n"
        )
    else:
        model = UPSTREAM_MODEL
        credentials = "      apiKeySecretRef:\n        name: mock-upstream-key\n        key: apiKey\n"
    upstreams = (
        "  upstreams:\n"
        f"    - name: primary\n      provider: {provider}\n      model: {model}\n"
        f"      baseUrl: {base_url}\n{credentials}"
    )
    if provider == "azure-openai":
        upstreams += f'      apiVersion: "{AZURE_API_VERSION}"\n'

    # svc/embed keeps its simulated upstream where the provider has no embeddings.
    embeddings = provider in ("openai", "azure-openai")
    lines, skipping, embed_route = [], False, False
    for line in (standalone / "models.yaml").read_text().splitlines():
        if line == "---":
            embed_route = False
        if line == "  model: svc/embed":
            embed_route = True
        if line == "  upstreams:" and (embeddings or not embed_route):
            lines.append(upstreams.rstrip("\n"))
            skipping = True
            continue
        if skipping and line.startswith("    "):
            continue
        skipping = False
        lines.append(line)
    (target / "models.yaml").write_text("\n".join(lines) + "\n")
    secret = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: mock-upstream-key\ntype: Opaque\n"
    aws = (
        "---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: mock-aws-credentials\ntype: Opaque\nstringData:\n"
        f"  accessKeyId: {AWS_ACCESS_KEY_ID}\n  secretAccessKey: {AWS_SECRET_ACCESS_KEY}\n"
        f"  sessionToken: {AWS_SESSION_TOKEN}\n"
    )
    # A key file is JSON, which YAML reads as a flow mapping: quoted whole, it stays a string.
    google = (
        "---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: mock-google-sa\ntype: Opaque\nstringData:\n"
        f"  key.json: '{json.dumps(mock.key_file())}'\n"
    )
    (target / "secrets.yaml").write_text(secret + f"stringData:\n  apiKey: {UPSTREAM_KEY}\n" + aws + google)
    return target


def carries_tool_output(body: dict, output: str) -> bool:
    """Whether an upstream request (any wire format) carries `output` back as a tool's result."""
    for content in body.get("contents", []):
        for part in content.get("parts", []):
            if output in json.dumps(part.get("functionResponse") or {}):
                return True
    for message in body.get("messages", []):
        content = message.get("content")
        if message.get("role") == "tool" and output in str(content):
            return True
        if isinstance(content, list) and any(
            b.get("type") == "tool_result" and output in str(b.get("content")) for b in content
        ):
            return True
    return False
