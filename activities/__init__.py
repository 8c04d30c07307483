"""Everything with I/O: the model call, the tool runner, and the tool authoring API
(``activities/tools.py``, whose names the package root re-exports)."""
