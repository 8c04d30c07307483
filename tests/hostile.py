"""A seeded generator of hostile ``resume`` payloads for a known paused conversation.

Each payload is wrong in a way a real sender could be: not JSON, not an object, wrong types,
missing or unknown fields, spoofed or stale refs, wrong names, edited restart inputs, outputs that
break the declared schema, duplicates, a valid entry mixed with a bad one, zero or two arguments,
odd encodings, deep nesting, oversized bodies. None of them may change the paused turn.
"""

from __future__ import annotations

import base64
import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from temporal_agent_interrupts.workflows.types import InterruptRequest


@dataclass(frozen=True)
class Payload:
    """One signal or update argument list, as raw bytes with an encoding each."""

    label: str
    args: list[tuple[bytes, str]] = field(default_factory=list)
    # The CLI cannot send invalid JSON as json/plain (it validates first); such cases are for
    # the SDK paths only.
    cli_ok: bool = True

    @classmethod
    def json(cls, label: str, value: Any) -> Payload:
        return cls(label, [(json.dumps(value).encode(), "json/plain")])

    def cli_args(self) -> list[str]:
        """``temporal workflow signal`` arguments that send exactly these payloads."""
        out: list[str] = []
        for data, encoding in self.args:
            if encoding == "json/plain":
                out += ["--input", data.decode()]
            elif encoding.startswith("json/"):
                # The CLI insists such input is JSON text; it cannot be base64 as well.
                out += ["--input-meta", f"encoding={encoding}", "--input", data.decode()]
            else:
                out += [
                    "--input-meta",
                    f"encoding={encoding}",
                    "--input-base64",
                    "--input",
                    base64.b64encode(data).decode(),
                ]
        return out


def _nested(depth: int) -> Any:
    value: Any = {"approved": True}
    for _ in range(depth):
        value = [value]
    return value


class HostileGenerator:
    """Deterministic for a seed; knows the real pending interrupts so it can spoof them well."""

    def __init__(self, pending: list[InterruptRequest], *, seed: int, stale_ref: str) -> None:
        self.rng = random.Random(seed)
        self.pending = pending
        self.stale_ref = stale_ref

    def _ref(self) -> str:
        return self.rng.choice(
            [
                str(uuid.UUID(int=self.rng.getrandbits(128))),
                self.stale_ref,
                self.rng.choice(self.pending).ref.upper(),
                self.rng.choice(self.pending).ref + " ",
                "",
                "\u202eferlaer",
                "ref\u0000null",
                "🙂",
            ]
        )

    def _real(self) -> InterruptRequest:
        return self.rng.choice(self.pending)

    def _junk(self, depth: int = 0) -> Any:
        kind = self.rng.randrange(8 if depth < 3 else 5)
        if kind == 0:
            return None
        if kind == 1:
            return self.rng.choice([True, False])
        if kind == 2:
            return self.rng.choice([0, -1, 2**63, 1.5e308, -0.0])
        if kind == 3:
            return "".join(
                self.rng.choice('ab"\\{}[]é\u2028🙂 ') for _ in range(self.rng.randrange(12))
            )
        if kind == 4:
            return self.rng.choice(["respond", "restart", "resume", self._real().ref])
        if kind == 5:
            return [self._junk(depth + 1) for _ in range(self.rng.randrange(4))]
        keys = ["respond", "restart", "identity", "metadata", "name", "ref", "output", "x"]
        return {self.rng.choice(keys): self._junk(depth + 1) for _ in range(self.rng.randrange(4))}

    def _good_entry(self, p: InterruptRequest) -> dict[str, Any]:
        if p.source == "interrupt":
            return {"name": p.name, "ref": p.ref, "output": {"approved": True}}
        return {"name": p.name, "ref": p.ref, "output": {"ok": True}}

    def _cases(self) -> list[Callable[[], Payload]]:
        real = self._real
        J = Payload.json  # noqa: N806  # a short alias keeps the table readable
        return [
            lambda: J("not an object", self.rng.choice([None, 1, "resume", [], [1], True])),
            lambda: J("junk", self._junk()),
            lambda: J(
                "empty", self.rng.choice([{}, {"respond": []}, {"respond": [], "restart": []}])
            ),
            lambda: J("unknown key", {self.rng.choice(["respnd", "Respond", "answers"]): []}),
            lambda: J(
                "extra key",
                {"respond": [self._good_entry(real())], "approve_all": True},
            ),
            lambda: J("respond not a list", {"respond": self.rng.choice(["x", 5, {}, None])}),
            lambda: J("entry not an object", {"respond": [self._junk(2) or 7]}),
            lambda: J("missing name", {"respond": [{"ref": real().ref, "output": {}}]}),
            lambda: J("missing ref", {"respond": [{"name": real().name, "output": {}}]}),
            lambda: J("missing output", {"respond": [{"name": real().name, "ref": real().ref}]}),
            lambda: J(
                "name not a string",
                {"respond": [{"name": 5, "ref": real().ref, "output": {}}]},
            ),
            lambda: J(
                "output not an object",
                {
                    "respond": [
                        {
                            "name": real().name,
                            "ref": real().ref,
                            "output": self.rng.choice([[], "yes", 1, None]),
                        }
                    ]
                },
            ),
            lambda: J(
                "spoofed ref",
                {
                    "respond": [
                        {"name": real().name, "ref": self._ref(), "output": {"approved": True}}
                    ]
                },
            ),
            lambda: J(
                "stale ref",
                {"respond": [{"name": real().name, "ref": self.stale_ref, "output": {}}]},
            ),
            lambda: self._wrong_name(),
            lambda: self._edited_restart(),
            lambda: self._schema_break(),
            lambda: self._duplicate(),
            lambda: self._valid_plus_bad(),
            lambda: J(
                "identity not a string",
                {"respond": [self._good_entry(real())], "identity": self.rng.choice([5, [], {}])},
            ),
            lambda: J(
                "metadata not an object",
                {"respond": [self._good_entry(real())], "metadata": self.rng.choice([5, [], "x"])},
            ),
            lambda: J(
                "resumed_metadata not an object",
                {"restart": [{"name": real().name, "ref": real().ref, "resumed_metadata": []}]},
            ),
            lambda: Payload("zero arguments", []),
            lambda: Payload(
                "two arguments",
                [(json.dumps({"respond": [self._good_entry(real())]}).encode(), "json/plain")] * 2,
            ),
            lambda: Payload(
                "binary encoding",
                [(self.rng.randbytes(self.rng.randrange(1, 64)), "binary/plain")],
            ),
            lambda: Payload(
                # JSON text, but claiming another encoding: still refused.
                "protobuf encoding",
                [(json.dumps({"respond": [self._good_entry(real())]}).encode(), "json/protobuf")],
            ),
            lambda: Payload("invalid JSON", [(b'{"respond": [', "json/plain")], cli_ok=False),
            lambda: Payload("NaN", [(b'{"respond": NaN}', "json/plain")], cli_ok=False),
            lambda: Payload(
                "invalid UTF-8", [(b'{"respond": "\xff\xfe"}', "json/plain")], cli_ok=False
            ),
            lambda: J("deeply nested", {"respond": _nested(self.rng.randrange(50, 400))}),
            lambda: Payload(
                "nested too deep for json",
                [(b"[" * 100_000 + b"]" * 100_000, "json/plain")],
                cli_ok=False,
            ),
        ]

    def _wrong_name(self) -> Payload:
        p = self._real()
        other = self.rng.choice(["lookup", "transferMoney", p.name.upper(), p.name + "x", ""])
        return Payload.json(
            "wrong name", {"respond": [{"name": other, "ref": p.ref, "output": {}}]}
        )

    def _edited_restart(self) -> Payload:
        p = self._real()
        edited = dict(p.input) | {"injected": self.rng.randrange(1000)}
        return Payload.json(
            "edited restart input",
            {
                "restart": [
                    {
                        "name": p.name,
                        "ref": p.ref,
                        "input": edited,
                        "resumed_metadata": {"tool_approved": True},
                    }
                ]
            },
        )

    def _schema_break(self) -> Payload:
        p = next((x for x in self.pending if x.source == "interrupt"), self._real())
        bad = self.rng.choice([{"approved": "yes"}, {}, {"approved": None}, {"approved": [True]}])
        return Payload.json(
            "output breaks schema", {"respond": [{"name": p.name, "ref": p.ref, "output": bad}]}
        )

    def _duplicate(self) -> Payload:
        p = self._real()
        return Payload.json(
            "same ref twice",
            {"respond": [self._good_entry(p)], "restart": [{"name": p.name, "ref": p.ref}]},
        )

    def _valid_plus_bad(self) -> Payload:
        good = [self._good_entry(p) for p in self.pending]
        bad = {"name": "approve", "ref": self._ref(), "output": {"approved": True}}
        entries = [*good, bad]
        self.rng.shuffle(entries)
        return Payload.json("valid entries plus one bad", {"respond": entries})

    def generate(self, n: int, *, cli: bool = False) -> list[Payload]:
        """``n`` payloads: every category once, then a seeded mix (CLI-sendable ones if asked)."""
        cases = self._cases()
        out: list[Payload] = []
        i = 0
        while len(out) < n:
            case = cases[i] if i < len(cases) else self.rng.choice(cases)
            i += 1
            p = case()
            if cli and not p.cli_ok:
                continue
            out.append(p)
        return out


def oversized(ref: str, name: str, *, size: int) -> Payload:
    body = {
        "respond": [{"name": name, "ref": ref, "output": {"approved": True, "pad": "x" * size}}]
    }
    return Payload.json("oversized", body)
