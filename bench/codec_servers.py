"""``python -m bench.codec_servers``: the codec server on uvicorn
(``temporal_agent_interrupts.codec_server``) against the asyncio and h11 server it replaced, side
by side in one run.

The old server is no longer in the tree: it is read from git (``git show
9bd4c85:worker/codec_server.py``, the last commit that had it) into a temporary module, so the
benchmark runs from a clean clone (it needs git and the repository's history). Two figures, each
for both servers and as the ratio ``new / old``:

- ``small_decode_ms``: a decode of one small payload (the UI's), over one kept-alive connection,
  the median (and the 90th percentile) of ``--requests`` of them, old and new interleaved so
  that a slow moment of the machine falls on both alike; the servers in this process, each on
  its own thread as in the worker.
- ``large_decode_peak_mib``: one 16 MiB decode (the largest request taken), sent from this
  process to a server in a subprocess of its own: the server process's peak resident memory
  (``VmHWM``, reset with ``/proc/self/clear_refs`` once the server is warm) less its resident
  memory just before, in MiB. Linux only.

Writes ``bench/results/codec_servers.json``; no test asserts any of it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import importlib.util
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from temporalio.api.common.v1 import Payload

from temporal_agent_interrupts.codec import EncryptionCodec, PayloadKeys, generate_key

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
OLD_COMMIT = "9bd4c85"
"""The last commit with the h11 server, at ``worker/codec_server.py``."""
MIB = 1024 * 1024


def old_module(into: Path) -> ModuleType:
    """The old codec server, from git, as a module of its own.

    Raises:
        SystemExit: git cannot show it (no history: not a clone).
    """
    try:
        source = subprocess.run(
            ["git", "show", f"{OLD_COMMIT}:worker/codec_server.py"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"cannot read the old codec server from git ({OLD_COMMIT}): {e}") from e
    path = into / "old_codec_server.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_codec_server", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def new_module() -> ModuleType:
    from temporal_agent_interrupts import codec_server

    return codec_server


def body_of(codec: EncryptionCodec, size: int) -> bytes:
    """A decode body of about ``size`` bytes: one sealed payload."""
    data = b"x" * max(1, size * 3 // 4 - 200)
    sealed = codec.encrypt(Payload(metadata={"encoding": b"json/plain"}, data=data))
    payload = {
        "metadata": {k: base64.b64encode(v).decode() for k, v in sealed.metadata.items()},
        "data": base64.b64encode(sealed.data).decode(),
    }
    return json.dumps({"payloads": [payload]}).encode()


def request(port: int, body: bytes) -> bytes:
    return (
        f"POST /decode HTTP/1.1\r\nHost: localhost:{port}\r\nX-Namespace: default\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def answer(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    found = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    assert found is not None, head
    await reader.readexactly(int(found[1]))
    return int(head.split()[1])


async def small_decodes(old: ModuleType, keys: PayloadKeys, requests: int) -> dict[str, Any]:
    body = body_of(EncryptionCodec(keys), 2 * 1024)
    samples: dict[str, list[float]] = {"old": [], "new": []}
    servers = {"old": old.CodecServer(keys, port=0), "new": new_module().CodecServer(keys, port=0)}
    connections = {}
    try:
        for name, server in servers.items():
            await server.start()
            port = urlsplit(server.url).port
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            connections[name] = (port, reader, writer)
        for i in range(requests + 20):
            for name, (port, reader, writer) in connections.items():
                began = time.perf_counter()
                writer.write(request(port, body))
                status = await answer(reader)
                if i >= 20:  # the first are warm-up
                    samples[name].append((time.perf_counter() - began) * 1000)
                assert status == 200, (name, status)
    finally:
        for _, _, writer in connections.values():
            writer.close()
        for server in servers.values():
            await server.stop()
    figures: dict[str, Any] = {}
    for name, values in samples.items():
        values.sort()
        figures[name] = {
            "median_ms": round(statistics.median(values), 3),
            "p90_ms": round(values[int(len(values) * 0.9)], 3),
        }
    figures["ratio_new_to_old_median"] = round(
        figures["new"]["median_ms"] / figures["old"]["median_ms"], 2
    )
    return figures


def _status_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB$", Path("/proc/self/status").read_text(), re.M)
    assert match, field
    return int(match[1])


async def _serve_child(which: str, old_path: str | None) -> None:
    """The subprocess: a server on a free port; prints its port, then on each line read, its
    resident and peak memory (KiB), resetting the peak after the first."""
    keys = PayloadKeys.parse(sys.stdin.readline().strip())
    if which == "old":
        assert old_path is not None
        spec = importlib.util.spec_from_file_location("old_codec_server", old_path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        module = new_module()
    async with module.CodecServer(keys, port=0) as server:
        print(urlsplit(server.url).port, flush=True)
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            if line.strip() == "reset":
                Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here on
            print(_status_kib("VmRSS"), _status_kib("VmHWM"), flush=True)


async def large_decode_peak(which: str, old_path: Path, keys: str, body: bytes) -> float:
    """The server process's peak memory over one 16 MiB decode, in MiB above its memory just
    before (warm: one small decode served first)."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.codec_servers",
        "--serve",
        which,
        "--old-path",
        str(old_path),
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        child.stdin.write(keys.encode() + b"\n")
        port = int(await child.stdout.readline())

        async def decode(data: bytes) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 26)
            writer.write(request(port, data))
            assert await answer(reader) == 200
            writer.close()

        await decode(body_of(EncryptionCodec(PayloadKeys.parse(keys)), 2 * 1024))  # warm
        child.stdin.write(b"reset\n")
        before = int((await child.stdout.readline()).split()[0])
        await decode(body)
        child.stdin.write(b"measure\n")
        peak = int((await child.stdout.readline()).split()[1])
        return round((peak - before) / 1024, 1)
    finally:
        child.stdin.close()
        try:
            await asyncio.wait_for(child.wait(), 10)
        except TimeoutError:
            child.kill()


async def measure(requests: int) -> dict[str, Any]:
    key = generate_key("bench")
    keys = PayloadKeys.parse(key)
    with tempfile.TemporaryDirectory() as into:
        old = old_module(Path(into))
        small = await small_decodes(old, keys, requests)
        body = body_of(EncryptionCodec(keys), 16 * MIB - 4096)
        old_path = Path(into) / "old_codec_server.py"
        peaks = {
            which: await large_decode_peak(which, old_path, key, body) for which in ("old", "new")
        }
    return {
        "old": f"git {OLD_COMMIT}:worker/codec_server.py (asyncio and h11)",
        "new": "temporal_agent_interrupts.codec_server (Starlette on uvicorn)",
        "small_decode": {"requests": requests, **small},
        "large_decode_peak_mib": {
            "body_mib": round(len(body) / MIB, 1),
            "measured": "the server subprocess's VmHWM over the decode, less its VmRSS before",
            **peaks,
            "ratio_new_to_old": round(peaks["new"] / peaks["old"], 2),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.codec_servers")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--serve", choices=["old", "new"], help=argparse.SUPPRESS)
    parser.add_argument("--old-path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve_child(args.serve, args.old_path))
        return
    out = asyncio.run(measure(args.requests))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "codec_servers.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
