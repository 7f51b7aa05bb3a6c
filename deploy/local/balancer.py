#!/usr/bin/env python3
"""A small round-robin TCP load balancer for the local stack: each new client connection goes to
the next backend that accepts it (a backend that refuses is skipped), bytes are copied both ways
unchanged, so JSON and SSE streams pass as they are.

    balancer.py LISTEN_PORT BACKEND_HOST:PORT [BACKEND_HOST:PORT ...]
"""

from __future__ import annotations

import asyncio
import itertools
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def main(port: int, backends: list[tuple[str, int]]) -> None:
    turn = itertools.cycle(range(len(backends)))

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        for _ in backends:
            host, backend_port = backends[next(turn)]
            try:
                up_r, up_w = await asyncio.open_connection(host, backend_port)
            except OSError:
                continue
            await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))
            return
        client_w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    listen = int(sys.argv[1])
    targets = [(h, int(p)) for h, p in (arg.rsplit(":", 1) for arg in sys.argv[2:])]
    asyncio.run(main(listen, targets))
