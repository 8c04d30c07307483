"""What Temporal stores, encrypted, and shown in the clear only to who holds the keys: the data
converter a team's own client connects with (``data_converter``), the keys (``PayloadKeys``,
``load_keys``, ``generate_key``), the codec itself (``EncryptionCodec``), and the codec server
that shows payloads to the Temporal UI and CLI (``CodecServer`` in process, ``codec_app`` to
mount in a team's own ASGI app; ``agent-codec-server`` is the command).

Public: every name in ``__all__`` is kept stable through 0.1.x (see CHANGELOG.md)::

    from temporal_agent_interrupts.payloads import data_converter, load_keys

A namespace of its own because encryption is a deployment's choice (``AGENT_PAYLOAD_KEYS``), made
once by whoever runs the workers, not by whoever writes an agent; the names live in ``codec``
and ``codec_server`` and are read on first use. Its errors (``PayloadKeyMissing``,
``PayloadKeysError``) are in ``temporal_agent_interrupts.errors`` with every other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from temporal_agent_interrupts._lazy import exports

if TYPE_CHECKING:
    from temporal_agent_interrupts.codec import (
        EncryptionCodec,
        PayloadKeys,
        data_converter,
        generate_key,
        load_keys,
    )
    from temporal_agent_interrupts.codec_server import CodecServer, codec_app

_HOME = {
    "data_converter": "codec",
    "PayloadKeys": "codec",
    "load_keys": "codec",
    "generate_key": "codec",
    "EncryptionCodec": "codec",
    "CodecServer": "codec_server",
    "codec_app": "codec_server",
}

__all__ = [
    "CodecServer",
    "EncryptionCodec",
    "PayloadKeys",
    "codec_app",
    "data_converter",
    "generate_key",
    "load_keys",
]

# Hidden from type checkers, which read the imports above (see the package root).
if not TYPE_CHECKING:
    __getattr__, __dir__ = exports(__name__, _HOME)
