"""The soak: conversations under load while workers and the server are killed, and the
invariants checked after (``python -m bench.soak``, ``make soak``; see ``__main__``)."""
