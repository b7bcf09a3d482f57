"""The benchmark's HTTPS receiver: ``python delivery_receiver_app.py PORT CERT KEY OUT``.

A bare ASGI app under uvicorn (TLS, keep-alive) that answers 204 at once and records each delivery's
``webhook-id`` and arrival time; SIGTERM writes them to OUT as JSON lines.
"""

from __future__ import annotations

import json
import sys
import time

import uvicorn

ARRIVALS: list[tuple[str, float]] = []


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    for name, value in scope["headers"]:
        if name == b"webhook-id":
            ARRIVALS.append((value.decode(), time.time()))
            break
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def main() -> None:
    port, cert, key, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    try:
        uvicorn.run(
            app,
            host="127.0.0.1",
            port=port,
            ssl_certfile=cert,
            ssl_keyfile=key,
            log_level="warning",
            access_log=False,
            timeout_keep_alive=30,
        )
    finally:
        with open(out, "w") as f:
            for delivery_id, at in ARRIVALS:
                f.write(json.dumps([delivery_id, at]) + "\n")


if __name__ == "__main__":
    main()
