"""The workers' result keys (``AGENT_RESULT_KEYS``): what seals every activity result, and how
the workflow gets them (``workflows.seal`` says why).

Internal: not covered by the 0.1.x stability promise (the public API is the package root and its
namespaces: docs/reference/api.md).

The same ``id:base64key[,id:base64key...]`` form as ``AGENT_PAYLOAD_KEYS``, 32 random bytes a
key; the first key seals, every listed key verifies. Every worker of a task queue (and every
replayer of its histories) needs the same set. Rotate by putting a new key first and keeping the
old one listed until the conversations it sealed results for have closed or continued as new.

A worker without keys refuses to start. ``AGENT_UNSIGNED_RESULTS=1`` (or
``AgentsPlugin(unsigned_results=True)``) runs without them, saying so loudly at every start:
then anyone who may complete an activity by id can answer as the model or a tool.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from temporalio.worker import Interceptor, WorkflowInterceptorClassInput

from temporal_agent_interrupts.codec import PayloadKeys, generate_key
from temporal_agent_interrupts.workflows.receipts import EXTERN as RECEIPTS_EXTERN
from temporal_agent_interrupts.workflows.receipts import Signer
from temporal_agent_interrupts.workflows.seal import EXTERN, ResultKeys

if TYPE_CHECKING:  # receipt_keys imports this module (its development key file's place)
    from temporal_agent_interrupts.worker.receipt_keys import ReceiptKeys

log = logging.getLogger(__name__)

ENV_VAR = "AGENT_RESULT_KEYS"
UNSIGNED_VAR = "AGENT_UNSIGNED_RESULTS"
DEV_KEY_FILE = "dev-result-keys"
"""The development key file's name (see :func:`dev_key_file`)."""

UNSIGNED = ResultKeys(off=True)


class ResultKeysMissing(ValueError):
    """A worker without result keys, and nothing saying to run without them."""


def parse_result_keys(value: str, *, source: str = ENV_VAR) -> ResultKeys:
    """Read ``id:base64key[,...]`` (the first seals).

    Raises:
        PayloadKeysError: an entry that cannot be used; the message never shows a key.
    """
    parsed = PayloadKeys.parse(value, source=source)
    return ResultKeys(keys=parsed.keys)


def generate_result_key(key_id: str | None = None) -> str:
    """A new ``id:base64key`` entry for ``AGENT_RESULT_KEYS`` (32 bytes from the OS)."""
    return generate_key(key_id)


def resolve_result_keys(
    keys: ResultKeys | str | None = None,
    *,
    unsigned: bool = False,
    environ: Mapping[str, str] | None = None,
) -> ResultKeys:
    """The key set a worker runs with: ``keys``, else ``AGENT_RESULT_KEYS``; with neither,
    :data:`UNSIGNED` when ``unsigned`` or ``AGENT_UNSIGNED_RESULTS=1`` says so (logged loudly).

    Raises:
        ResultKeysMissing: no keys, and nothing says to run without them.
        PayloadKeysError: keys that cannot be used.
    """
    env = os.environ if environ is None else environ
    if isinstance(keys, str):
        keys = parse_result_keys(keys, source="result_keys=")
    if keys is None and env.get(ENV_VAR, "").strip():
        keys = parse_result_keys(env[ENV_VAR])
    if keys is not None and (keys.keys or keys.off):
        return keys
    if unsigned or env.get(UNSIGNED_VAR, "").strip().lower() in ("1", "true", "yes"):
        log.warning(
            "RESULTS ARE NOT SEALED (%s=1 or unsigned_results=True): anyone who may complete an "
            "activity by id (RespondActivityTaskCompletedById; Temporal Cloud grants it with "
            "namespace write access) can answer as the model or a tool, tool calls and agent "
            "definitions included. Set %s on every worker instead.",
            UNSIGNED_VAR,
            ENV_VAR,
        )
        return UNSIGNED
    raise ResultKeysMissing(
        f"no result keys: set {ENV_VAR} on every worker of the task queue (and the replayers "
        f"of its histories) to the same value, made by `agent-worker --generate-result-key` "
        f"(id:base64key; the first seals, every one listed verifies), or pass "
        f"AgentsPlugin(result_keys=...). Without them anyone who may complete an activity by id "
        f"can answer as the model or a tool. To run unprotected anyway, set {UNSIGNED_VAR}=1"
    )


def dev_key_file(environ: Mapping[str, str] | None = None) -> Path:
    """Where a development machine keeps its result key: one per user (``$XDG_STATE_HOME``, else
    ``~/.local/state``), so every worker started against the local dev server, from any folder,
    seals and checks with the same key, across restarts."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME", "").strip() or str(Path.home() / ".local" / "state")
    return Path(base) / "temporal-agent-interrupts" / DEV_KEY_FILE


def dev_result_keys(path: Path | None = None) -> ResultKeys:
    """The keys of a worker on the embedded default (the local dev server, nothing configured):
    ``AGENT_RESULT_KEYS`` when set, else the development key file (:func:`dev_key_file`), made
    once and readable by its owner only. So `make run`, `make demo` and `agent-worker` beside
    them work on a fresh machine, and keep verifying what they sealed across restarts. Never
    used for a configured server: a deployment sets ``AGENT_RESULT_KEYS``."""
    if os.environ.get(ENV_VAR, "").strip():
        return parse_result_keys(os.environ[ENV_VAR])
    path = path if path is not None else dev_key_file()
    text = dev_key_text(path, generate_result_key, what="result")
    log.info(
        "results are sealed with the development key in %s (the local dev server, nothing "
        "configured); set %s for any other deployment",
        path,
        ENV_VAR,
    )
    return parse_result_keys(text, source=str(path))


def dev_key_text(path: Path, generate: Callable[[str], str], *, what: str) -> str:
    """A development key file's text, made once (``generate("dev")``), readable by its owner
    only; a worker that finds another made it first reads theirs."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
        except FileExistsError:
            pass  # another worker made it first: read theirs
        else:
            with os.fdopen(fd, "w") as f:
                f.write(generate("dev") + "\n")
            log.info("made a development %s key in %s", what, path)
    return path.read_text().strip()


class ResultKeysInterceptor(Interceptor):
    """Gives the workflows of a worker (or a replayer) its result keys, as an extern function:
    the secret bytes never enter history or the workflow's inputs."""

    def __init__(self, keys: ResultKeys, *, receipt_keys: ReceiptKeys | None = None) -> None:
        self.keys = keys
        self.receipt_keys = receipt_keys

    def _give(self) -> ResultKeys:
        return self.keys

    def _signer(self) -> Signer:
        # The signing function, not the key: the workflow never holds the key itself.
        assert self.receipt_keys is not None
        return self.receipt_keys.sign

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> None:
        functions: Any = input.unsafe_extern_functions
        give: Callable[[], ResultKeys] = self._give
        functions[EXTERN] = give
        if self.receipt_keys is not None:
            # Decision receipts are signed in the workflow (workflows.receipts says why).
            signer: Callable[[], Signer] = self._signer
            functions[RECEIPTS_EXTERN] = signer
        return None
