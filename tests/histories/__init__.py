"""Recorded conversations (see ``record.py``) and how to read them back."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import WorkflowHistory

WORKFLOW_ID_KEY = "workflowId"
"""The key beside a recorded file's events that names its workflow (a chat's id is not always
the file's name: a continued conversation's runs, a sub-agent's chat)."""


def load(path: Path) -> WorkflowHistory:
    """A recorded history, under the workflow id it ran as: a replay checks each result's seal
    against it (``workflows.seal``)."""
    data = json.loads(path.read_text())
    workflow_id = data.pop(WORKFLOW_ID_KEY, path.stem)
    return WorkflowHistory.from_json(workflow_id, data)
