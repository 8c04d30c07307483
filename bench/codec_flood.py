"""``python -m bench.codec_flood``: what a body of empty payloads costs the codec server, and
what an honest decode waits while such a body's answer goes out.

The tests (``tests/test_codec_server_attacks.py``) assert what bounds it: a body over
``MAX_PAYLOADS`` is refused with no payload transformed, an answer goes out in chunks of
``SEND_CHUNK_BYTES``, and the server's loop runs other work between them. How long that takes
is machine-dependent, so it is measured here, each figure as a ratio to a baseline measured in
the same run, over loopback to a server in this process, interleaved and the median of a few
runs:

- ``empty_*_to_one_payload``: a decode (or encode) of empty payloads against a decode of one
  payload whose body is the same size (the defect: 128 KiB of empty payloads took seconds
  where one payload takes a millisecond or two);
- ``honest_during_flood_to_alone``: an honest decode sent once the answer of an encode of
  ``MAX_PAYLOADS`` empty payloads has begun, against the same decode on an idle server (the
  defect: one such answer held the honest decode for seconds).

Writes ``bench/results/codec_flood.json``; no timing is asserted anywhere in the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from temporalio.api.common.v1 import Payload

from temporal_agent_interrupts.codec import EncryptionCodec, PayloadKeys, generate_key
from temporal_agent_interrupts.codec_server import MAX_PAYLOADS, CodecServer

RESULTS = Path(__file__).parent / "results"
KIB = 1024


def empty_payloads(count: int) -> bytes:
    return b'{"payloads":[' + b",".join([b"{}"] * count) + b"]}"


def one_payload(codec: EncryptionCodec, size: int) -> bytes:
    """A decode body of about ``size`` bytes: one sealed payload."""
    data = b"x" * (size * 3 // 4 - 200)
    sealed = codec.encrypt(Payload(metadata={"encoding": b"json/plain"}, data=data))
    payload = {
        "metadata": {k: base64.b64encode(v).decode() for k, v in sealed.metadata.items()},
        "data": base64.b64encode(sealed.data).decode(),
    }
    return json.dumps({"payloads": [payload]}).encode()


class Client:
    def __init__(self, server: CodecServer) -> None:
        port = urlsplit(server.url).port
        assert port is not None
        self.port = port

    def request(self, body: bytes, path: str = "/decode") -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: localhost:{self.port}\r\nX-Namespace: default\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode() + body

    async def send(
        self, body: bytes, path: str = "/decode"
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 24)
        writer.write(self.request(body, path))
        await writer.drain()
        return reader, writer

    @staticmethod
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        head = await reader.readuntil(b"\r\n\r\n")
        found = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        assert found is not None, head
        await reader.readexactly(int(found[1]))
        writer.close()
        return int(head.split()[1])

    async def timed(self, body: bytes, path: str = "/decode") -> tuple[int, float]:
        """The status and the milliseconds from the request's first byte to the answer's
        last."""
        began = time.perf_counter()
        status = await self.answer(*await self.send(body, path))
        return status, (time.perf_counter() - began) * 1000


async def honest_during_flood(client: Client, honest: bytes, flood: bytes) -> float:
    reader, writer = await client.send(flood, "/encode")
    await reader.readexactly(1)  # its answer has begun
    status, ms = await client.timed(honest)
    assert status == 200
    await reader.read()
    writer.close()
    return ms


async def measure(runs: int) -> dict[str, Any]:
    keys = PayloadKeys.parse(generate_key("bench"))
    codec = EncryptionCodec(keys)
    async with CodecServer(keys, port=0) as server:
        client = Client(server)
        at_limit = empty_payloads(MAX_PAYLOADS)
        over_limit = empty_payloads(128 * KIB // 3)
        one_at_limit_size = one_payload(codec, len(at_limit))
        one_128k = one_payload(codec, len(over_limit))
        honest = one_payload(codec, 1 * KIB)
        cases = {
            "one_payload_12KiB": (one_at_limit_size, "/decode"),
            "one_payload_128KiB": (one_128k, "/decode"),
            "empty_at_limit_decode_12KiB": (at_limit, "/decode"),
            "empty_at_limit_encode_12KiB": (at_limit, "/encode"),
            "empty_over_limit_128KiB": (over_limit, "/decode"),
            "honest_alone": (honest, "/decode"),
        }
        samples: dict[str, list[float]] = {name: [] for name in [*cases, "honest_during_flood"]}
        statuses: dict[str, int] = {}
        for _ in range(runs):  # interleaved: a slow moment of the machine falls on all alike
            for name, (body, path) in cases.items():
                statuses[name], ms = await client.timed(body, path)
                samples[name].append(ms)
            samples["honest_during_flood"].append(
                await honest_during_flood(client, honest, at_limit)
            )
    median = {name: statistics.median(values) for name, values in samples.items()}
    ratios = {
        "empty_at_limit_decode_to_one_payload": median["empty_at_limit_decode_12KiB"]
        / median["one_payload_12KiB"],
        "empty_at_limit_encode_to_one_payload": median["empty_at_limit_encode_12KiB"]
        / median["one_payload_12KiB"],
        "empty_over_limit_to_one_payload": median["empty_over_limit_128KiB"]
        / median["one_payload_128KiB"],
        "honest_during_flood_to_alone": median["honest_during_flood"] / median["honest_alone"],
    }
    return {
        "runs": runs,
        "statuses": statuses,
        "median_ms": {k: round(v, 2) for k, v in median.items()},
        "ratios": {k: round(v, 2) for k, v in ratios.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.codec_flood")
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    out = asyncio.run(measure(args.runs))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "codec_flood.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
