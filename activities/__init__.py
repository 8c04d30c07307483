"""Everything with I/O: the model call, the tool runner, and the tool authoring API
(``activities/tools.py``, whose names the package root re-exports).

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).
"""
