#!/usr/bin/env node
// The official AG-UI client (npm @ag-ui/client) against an app's POST /agui/{agent}: what a web
// front end built on AG-UI sees. tests/test_agui_client.py runs it, one scenario a process, and
// asserts on the JSON report it prints to stdout.
//
// Every run goes through HttpAgent.runAgent, so the client's own pipeline checks each event as a
// user's front end would: the event schemas (enforceEvents: a malformed field fails the run,
// unknown material is stripped with a console warning, which the report keeps) and the event
// order (verifyEvents: one RUN_STARTED, messages and tool calls opened before they continue and
// closed before the run ends, nothing after RUN_FINISHED or RUN_ERROR). Nothing here bypasses it.
//
// Usage:
//   node run.mjs --url URL --scenario NAME [--thread ID] [--message TEXT] [--identity WHO]
//                [--payload JSON] [--interrupt-id ID]... [--cut-first SPEC] [--cut-second SPEC]
// (each option also read from AGUI_<OPTION>, e.g. AGUI_URL, AGUI_CUT_FIRST).
//   URL       the run endpoint, http://127.0.0.1:PORT/agui/AGENT
//   NAME      approve         a user message runs until it pauses, then one resume answers every
//                             interrupt "resolved" with PAYLOAD (default {"approved": true})
//             refuse-unknown  a user message runs until it pauses; then a resume covering the
//                             real interrupts plus an unknown id (the same agent, which holds the
//                             pending list), then a fresh agent on the thread resuming only an
//                             unknown id (a fresh agent has no pending list to cover)
//             resume          a fresh agent on --thread resumes each --interrupt-id with PAYLOAD
//   SPEC      cut that run's connection: after the Kth frame of an event type ("TYPE" or
//             "TYPE:K"), or after N frames (a number); then re-POST the same body with
//             `Last-Event-ID: <the last id seen>` and splice the new body on, so that the client
//             reads one stream. After a cut run ends, the same body is POSTed once more with
//             the id of the run's first frame (`replay` in the report, read raw, not through the
//             client): the run as one unbroken connection reads it, to compare frame by frame.
//
// Exit status: 0 when every run completed in the client (a RUN_ERROR the server sent is a
// completed run: the report says so); 1 when the client failed a run (its verification or schema
// check refused the stream, an HTTP error, a broken reconnect); 2 for bad arguments; 3 when the
// scenario could not go on (no interrupt to resume). The report is printed in every case.

import { HttpAgent } from "@ag-ui/client";
import { EventType } from "@ag-ui/core";
import { randomUUID } from "node:crypto";

const OPTIONS = {
  url: { env: "AGUI_URL" },
  scenario: { env: "AGUI_SCENARIO" },
  thread: { env: "AGUI_THREAD" },
  message: { env: "AGUI_MESSAGE", default: "hello" },
  identity: { env: "AGUI_IDENTITY" },
  payload: { env: "AGUI_PAYLOAD", default: '{"approved": true}' },
  "interrupt-id": { env: "AGUI_INTERRUPT_ID", many: true },
  "unknown-id": { env: "AGUI_UNKNOWN_ID", default: "no-such-interrupt" },
  "cut-first": { env: "AGUI_CUT_FIRST" },
  "cut-second": { env: "AGUI_CUT_SECOND" },
};

class UsageError extends Error {}
class ScenarioStuck extends Error {}

function parseArgs(argv) {
  const given = {};
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (!arg.startsWith("--")) throw new UsageError(`unexpected argument ${JSON.stringify(arg)}`);
    const eq = arg.indexOf("=");
    const name = eq < 0 ? arg.slice(2) : arg.slice(2, eq);
    if (!(name in OPTIONS)) throw new UsageError(`unknown option --${name}`);
    let value;
    if (eq >= 0) value = arg.slice(eq + 1);
    else if (i + 1 < argv.length) value = argv[++i];
    else throw new UsageError(`--${name} needs a value`);
    if (OPTIONS[name].many) (given[name] ??= []).push(value);
    else given[name] = value;
  }
  const opts = {};
  for (const [name, spec] of Object.entries(OPTIONS)) {
    const env = process.env[spec.env];
    let value = given[name] ?? (env !== undefined && env !== "" ? env : spec.default);
    if (spec.many && typeof value === "string") value = value.split(",").filter(Boolean);
    opts[name] = value ?? (spec.many ? [] : undefined);
  }
  if (!opts.url) throw new UsageError("--url (or AGUI_URL) is required");
  if (!opts.scenario) throw new UsageError("--scenario (or AGUI_SCENARIO) is required");
  try {
    opts.payload = JSON.parse(opts.payload);
  } catch (e) {
    throw new UsageError(`--payload is not JSON: ${e.message}`);
  }
  for (const name of ["cut-first", "cut-second"]) {
    if (opts[name] !== undefined) opts[name] = parseCut(opts[name], name);
  }
  return opts;
}

function parseCut(text, name) {
  if (/^\d+$/.test(text)) {
    const frames = Number(text);
    if (frames < 1) throw new UsageError(`--${name}: cut after at least one frame`);
    return { text, frames };
  }
  const m = /^([A-Z_]+)(?::(\d+))?$/.exec(text);
  if (!m || !Object.values(EventType).includes(m[1])) {
    throw new UsageError(`--${name} ${JSON.stringify(text)}: give N frames or an event TYPE[:K]`);
  }
  return { text, type: m[1], nth: m[2] === undefined ? 1 : Number(m[2]) };
}

// --- warnings the client prints (schema deviations it stripped, run failures) -------------------

const warnings = [];
for (const level of ["warn", "error"]) {
  const original = console[level].bind(console);
  console[level] = (...args) => {
    warnings.push({
      level,
      text: args.map((a) => (a instanceof Error ? `${a.name}: ${a.message}` : String(a))).join(" "),
    });
    original(...args); // still on stderr, for whoever reads the test's output
  };
}

// --- the SSE frames on the wire, as a second reader independent of the client's parser ---------

const decoder = () => new TextDecoder("utf-8");
const encoder = new TextEncoder();
// An event ends at a blank line, whichever of the three line endings the server uses.
const FRAME_END = /\r\n\r\n|\n\n|\r\r/;

function parseFrame(raw) {
  let id = null;
  const data = [];
  for (const line of raw.split(/\r\n|\n|\r/)) {
    if (line.startsWith("id:")) id = line.slice(3).replace(/^ /, "");
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  let type = null;
  if (data.length > 0) {
    try {
      type = JSON.parse(data.join("\n"))?.type ?? null;
    } catch {
      type = "(not JSON)";
    }
  }
  return { id, type, data: data.length > 0 ? data.join("\n") : null, hasData: data.length > 0 };
}

// Yields each complete frame (its raw text, terminator included) as it arrives.
async function* sseFrames(body) {
  const reader = body.getReader();
  const text = decoder();
  let buffer = "";
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      buffer += text.decode(value, { stream: true });
      for (let m = FRAME_END.exec(buffer); m; m = FRAME_END.exec(buffer)) {
        const end = m.index + m[0].length;
        const raw = buffer.slice(0, end);
        buffer = buffer.slice(end);
        yield { raw, ...parseFrame(raw) };
      }
    }
    buffer += text.decode();
    if (buffer.trim() !== "") yield { raw: buffer, ...parseFrame(buffer), unterminated: true };
  } finally {
    reader.cancel().catch(() => {});
  }
}

// A fetch for HttpAgentConfig.fetch: records every frame of every response, and, when a cut is
// armed for the next request, drops that connection after the cut point and reattaches with
// Last-Event-ID, handing the client one body made of both.
function wireFetch() {
  const wire = {
    requests: [],
    armed: undefined,
    arm(cut) {
      this.armed = cut;
    },
  };
  wire.fetch = async (url, init) => {
    const cut = wire.armed;
    wire.lastRequest = { url, init };
    wire.armed = undefined;
    const request = { frames: [], cut: cut ? { spec: cut.text, happened: false } : null };
    wire.requests.push(request);
    // The connection's own controller: aborting it drops the socket; the client's abort (its
    // signal in init) still ends everything.
    const connection = new AbortController();
    const outer = init.signal;
    if (outer) {
      if (outer.aborted) connection.abort(outer.reason);
      outer.addEventListener("abort", () => connection.abort(outer.reason), { once: true });
    }
    const first = await fetch(url, { ...init, signal: connection.signal });
    request.status = first.status;
    request.contentType = first.headers.get("content-type");
    if (!first.ok || !first.body) return first;

    async function* spliced() {
      const counts = new Map();
      let dataFrames = 0;
      let last = null;
      for await (const frame of sseFrames(first.body)) {
        request.frames.push({ id: frame.id, type: frame.type, data: frame.data, connection: 1 });
        if (frame.id !== null) last = frame.id;
        yield frame.raw;
        if (!cut || !frame.hasData) continue;
        dataFrames += 1;
        counts.set(frame.type, (counts.get(frame.type) ?? 0) + 1);
        const reached =
          cut.frames !== undefined ? dataFrames === cut.frames : counts.get(cut.type) === cut.nth;
        if (reached) {
          request.cut.happened = true;
          request.cut.afterId = last;
          request.cut.afterType = frame.type;
          request.cut.framesBefore = dataFrames;
          break;
        }
      }
      if (!request.cut?.happened) return; // the stream ended before the cut point
      connection.abort(new Error("the test dropped the connection"));
      if (last === null) throw new Error("cut: no `id:` seen before the cut, nothing to reattach after");
      const headers = new Headers(init.headers);
      headers.set("Last-Event-ID", last);
      const again = await fetch(url, { ...init, headers, signal: outer });
      request.cut.reconnectStatus = again.status;
      request.cut.reconnectContentType = again.headers.get("content-type");
      if (!again.ok || !again.body) {
        throw new Error(`reconnect with Last-Event-ID ${last}: HTTP ${again.status}: ${await again.text()}`);
      }
      for await (const frame of sseFrames(again.body)) {
        request.frames.push({ id: frame.id, type: frame.type, data: frame.data, connection: 2 });
        yield frame.raw;
      }
    }

    const chunks = spliced();
    const body = new ReadableStream({
      async pull(controller) {
        try {
          const { done, value } = await chunks.next();
          if (done) controller.close();
          else controller.enqueue(encoder.encode(value));
        } catch (e) {
          controller.error(e);
        }
      },
      async cancel() {
        connection.abort();
        await chunks.return(undefined);
      },
    });
    return new Response(body, {
      status: first.status,
      statusText: first.statusText,
      headers: first.headers,
    });
  };
  return wire;
}

// --- one run through the client ------------------------------------------------------------------

async function run(agent, wire, { label, cut, params }) {
  wire.arm(cut);
  const before = wire.requests.length;
  const record = {
    label,
    threadId: agent.threadId,
    resume: params.resume ?? null,
    events: [],
    outcome: null,
    interrupts: [],
    runError: null,
    error: null,
  };
  const subscriber = {
    onEvent({ event }) {
      record.events.push(structuredClone(event));
    },
    onRunFinishedEvent(p) {
      record.outcome = p.outcome;
      if (p.outcome === "interrupt") record.interrupts = structuredClone(p.interrupts);
    },
    onRunErrorEvent({ event }) {
      record.outcome = "run_error";
      record.runError = { message: event.message, code: event.code ?? null };
    },
    onRunFailed({ error }) {
      record.error = describe(error);
    },
  };
  try {
    await agent.runAgent(params, subscriber);
  } catch (e) {
    record.error ??= describe(e);
  }
  if (record.error) record.outcome = "client_error";
  const request = wire.requests[before];
  record.http = request ? { status: request.status, contentType: request.contentType } : null;
  record.frames = request ? request.frames : [];
  record.cut = request ? request.cut : null;
  if (cut && !record.error && !record.cut?.happened) {
    record.error = { name: "CutMissed", message: `the stream ended before the cut point ${cut.text}` };
    record.outcome = "client_error";
  }
  if (record.cut?.happened && !record.error) {
    try {
      record.replay = await replay(wire, record.frames);
    } catch (e) {
      record.replay = { error: `${e.name}: ${e.message}` };
    }
  }
  record.pendingAfter = structuredClone(agent.pendingInterrupts);
  record.text = messageTexts(record.events);
  record.toolCalls = toolCalls(record.events);
  record.toolResults = record.events
    .filter((e) => e.type === EventType.TOOL_CALL_RESULT)
    .map((e) => ({ toolCallId: e.toolCallId, content: e.content, messageId: e.messageId }));
  return record;
}

// The same run read again from its first frame on, over one connection that nobody cuts.
async function replay(wire, frames) {
  const first = frames.find((f) => f.id !== null);
  if (!first) return { error: "no frame with an id to replay after" };
  const { url, init } = wire.lastRequest;
  const headers = new Headers(init.headers);
  headers.set("Last-Event-ID", first.id);
  const response = await fetch(url, { ...init, headers, signal: undefined });
  const result = { afterId: first.id, status: response.status, frames: [] };
  if (!response.ok || !response.body) {
    result.error = await response.text();
    return result;
  }
  for await (const frame of sseFrames(response.body)) {
    result.frames.push({ id: frame.id, type: frame.type, data: frame.data });
  }
  return result;
}

function describe(error) {
  return {
    name: error?.name ?? "Error",
    message: error?.message ?? String(error),
    status: error?.status ?? null,
    payload: error?.payload ?? null,
  };
}

function messageTexts(events) {
  const texts = new Map();
  for (const e of events) {
    if (e.type === EventType.TEXT_MESSAGE_START) texts.set(e.messageId, "");
    if (e.type === EventType.TEXT_MESSAGE_CONTENT) texts.set(e.messageId, (texts.get(e.messageId) ?? "") + e.delta);
  }
  return [...texts].map(([messageId, text]) => ({ messageId, text }));
}

function toolCalls(events) {
  const calls = new Map();
  for (const e of events) {
    if (e.type === EventType.TOOL_CALL_START) calls.set(e.toolCallId, { toolCallId: e.toolCallId, name: e.toolCallName, args: "", ended: false });
    if (e.type === EventType.TOOL_CALL_ARGS) calls.get(e.toolCallId).args += e.delta;
    if (e.type === EventType.TOOL_CALL_END) calls.get(e.toolCallId).ended = true;
  }
  return [...calls.values()];
}

// --- scenarios -----------------------------------------------------------------------------------

function newAgent(opts, wire, threadId) {
  return new HttpAgent({
    url: opts.url,
    threadId,
    headers: opts.identity ? { "X-Agent-Identity": opts.identity } : {},
    fetch: wire.fetch,
  });
}

async function runUntilPaused(opts, wire, report, agent) {
  agent.addMessage({ id: randomUUID(), role: "user", content: opts.message });
  const first = await run(agent, wire, { label: "message", cut: opts["cut-first"], params: {} });
  report.runs.push(first);
  if (first.error) return false;
  if (first.outcome !== "interrupt" || agent.pendingInterrupts.length === 0) {
    throw new ScenarioStuck(`the message's run ended ${JSON.stringify(first.outcome)}, not paused on an interrupt`);
  }
  return true;
}

const resolved = (interruptId, payload) => ({ interruptId, status: "resolved", payload });

const SCENARIOS = {
  async approve(opts, wire, report) {
    const agent = newAgent(opts, wire, report.threadId);
    if (!(await runUntilPaused(opts, wire, report, agent))) return;
    const resume = agent.pendingInterrupts.map((i) => resolved(i.id, opts.payload));
    report.runs.push(await run(agent, wire, { label: "resume", cut: opts["cut-second"], params: { resume } }));
  },

  async "refuse-unknown"(opts, wire, report) {
    const agent = newAgent(opts, wire, report.threadId);
    if (!(await runUntilPaused(opts, wire, report, agent))) return;
    const unknown = opts["unknown-id"];
    // The client refuses, before sending, a resume that leaves a pending interrupt unanswered:
    // this one covers them all and adds an id the server never issued.
    const covering = [...agent.pendingInterrupts.map((i) => resolved(i.id, opts.payload)), resolved(unknown, opts.payload)];
    report.runs.push(await run(agent, wire, { label: "covering-plus-unknown", params: { resume: covering } }));
    // A fresh agent on the thread holds no pending list (a page reloaded, another tab).
    const fresh = newAgent(opts, wire, report.threadId);
    report.runs.push(await run(fresh, wire, { label: "unknown-only", params: { resume: [resolved(unknown, opts.payload)] } }));
  },

  async resume(opts, wire, report) {
    if (!opts.thread) throw new UsageError("scenario resume needs --thread");
    if (opts["interrupt-id"].length === 0) throw new UsageError("scenario resume needs --interrupt-id");
    const agent = newAgent(opts, wire, report.threadId);
    const resume = opts["interrupt-id"].map((id) => resolved(id, opts.payload));
    report.runs.push(await run(agent, wire, { label: "resume", cut: opts["cut-first"], params: { resume } }));
  },
};

async function main() {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
    if (!(opts.scenario in SCENARIOS)) {
      throw new UsageError(`unknown scenario ${JSON.stringify(opts.scenario)} (${Object.keys(SCENARIOS).join(", ")})`);
    }
  } catch (e) {
    if (!(e instanceof UsageError)) throw e;
    process.stdout.write(JSON.stringify({ ok: false, failure: `usage: ${e.message}` }) + "\n");
    return 2;
  }
  const report = {
    scenario: opts.scenario,
    url: opts.url,
    threadId: opts.thread ?? randomUUID(),
    node: process.version,
    runs: [],
    warnings,
    ok: false,
    failure: null,
  };
  const wire = wireFetch();
  let code = 0;
  try {
    await SCENARIOS[opts.scenario](opts, wire, report);
    const failed = report.runs.find((r) => r.error);
    if (failed) {
      report.failure = `run ${failed.label}: ${failed.error.name}: ${failed.error.message}`;
      code = 1;
    }
  } catch (e) {
    report.failure = `${e.name}: ${e.message}`;
    code = e instanceof ScenarioStuck ? 3 : e instanceof UsageError ? 2 : 1;
  }
  report.ok = code === 0;
  process.stdout.write(JSON.stringify(report) + "\n");
  return code;
}

process.exitCode = await main();
