"""Deprecated: the codec server is :mod:`temporal_agent_interrupts.codec_server` now, on the
product's one HTTP stack. This path re-exports its names, warns, and goes in 0.2.

Internal: not covered by the 0.1.x stability promise; the codec server's public names are
imported from ``temporal_agent_interrupts.payloads``.
"""

import warnings

from temporal_agent_interrupts.codec_server import *  # noqa: F403  # every public name, as before
from temporal_agent_interrupts.codec_server import __all__, main  # noqa: F401  # re-exported

warnings.warn(
    "temporal_agent_interrupts.worker.codec_server is deprecated (it goes in 0.2): "
    "import temporal_agent_interrupts.codec_server",
    DeprecationWarning,
    stacklevel=2,
)

if __name__ == "__main__":
    main()
