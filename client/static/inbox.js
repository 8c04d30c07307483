// The approver's inbox page: lists the calls paused on a human (GET /api/inbox) and answers
// them (POST /api/chats/{chat_id}/interrupts/{ref}), showing what each answer did.
//
// What it shows comes from whoever wrote the conversation: a tool's input is the model's (and so
// possibly a prompt injection's) text, a memo may be a stranger's. So the page builds its DOM with
// createElement and textContent only, never innerHTML, and every URL part goes through
// encodeURIComponent. No inline script or style anywhere: the app sends `default-src 'self'`.
//
// Every answer carries the input_digest of the entry it was clicked on: the app refuses it
// (409) when the call's input is no longer the one shown, or the call was answered already.
//
// Each call reads as the conversation wrote it for people (`shown`: the summary, the tool's
// risk, why it waits, the fields, the user's request and the model's words); its raw input is
// behind a "details" disclosure. Edit (an editable tool) and Respond (an interrupt-only tool)
// are forms made from the call's schema, fetched with the chat's pending calls.
"use strict";

(() => {
  // The list is polled every 2 s, and only while the tab is visible (a hidden tab stops polling
  // and refreshes once when shown again): the inbox is read from Temporal's visibility store,
  // which itself lags about a second, so polling faster would show nothing sooner.
  const POLL_MS = 2000;
  // A listing that hangs must not stop the polling for good.
  const LIST_TIMEOUT_MS = 10000;

  // The app's root, from this script's own URL (…/inbox/inbox.js), so that the page works where
  // the app is mounted under a prefix (a FastAPI service's app.mount("/agents", ...)).
  const ROOT = new URL("..", document.currentScript.src);
  const api = (path) => new URL("api/" + path, ROOT);

  const SOURCES = {
    approval: "gated tool: approving runs it",
    tool: "raised by the tool: approving runs it again",
    interrupt: "question for a human",
    input: "a form its MCP server asks for: answer with its data (agentctl respond), or deny to decline",
  };

  const $ = (id) => document.getElementById(id);
  const entriesBody = $("entries");
  const statusLine = $("status");
  const results = $("results");

  /** An element with attributes and children (strings become text nodes, never markup). */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs)) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "class") node.className = value;
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === undefined || child === null) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  const str = (value) => (typeof value === "string" ? value : value == null ? "" : String(value));

  function timeEl(iso, { ago = false } = {}) {
    if (!iso) return el("span", { class: "none" }, "none");
    const when = new Date(iso);
    if (Number.isNaN(when.getTime())) return el("span", {}, str(iso));
    let shown = when.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
    if (ago) {
      const minutes = Math.max(0, Math.round((Date.now() - when.getTime()) / 60000));
      shown += minutes < 1 ? " (just now)" : ` (${minutes} min ago)`;
    }
    return el("time", { datetime: str(iso), title: str(iso) }, shown);
  }

  function json(value) {
    return el("pre", { class: "json" }, JSON.stringify(value, null, 2) ?? "");
  }

  /** The problem a refused request answered with (application/problem+json), in words. */
  async function problemOf(response) {
    let body = null;
    try {
      body = await response.json();
    } catch {
      body = null;
    }
    const field = (key) => (body && typeof body[key] === "string" ? body[key] : "");
    return {
      status: response.status,
      title: field("title") || response.statusText || "Error",
      detail: field("detail") || field("title") || `HTTP ${response.status}`,
      code: field("code"),
    };
  }

  // ---------------------------------------------------------------------------------------
  // Who the app takes answers from.

  let identity = null;

  async function showWhoami() {
    const line = $("whoami");
    try {
      const response = await fetch(api("whoami"), { headers: { Accept: "application/json" } });
      if (!response.ok) {
        const problem = await problemOf(response);
        line.replaceChildren(`Could not tell who you answer as: ${problem.detail}`);
        return;
      }
      const who = await response.json();
      const mode = str(who.mode);
      if (mode === "bearer") {
        // The token is passed on to the agent, which verifies it: the app names no one here.
        line.replaceChildren(
          who.identity == null
            ? "No bearer token comes with this page's requests: your answers will be refused."
            : "You answer with the identity token your requests carry (the agent verifies it)."
        );
        return;
      }
      identity = typeof who.identity === "string" ? who.identity : null;
      if (identity === null) {
        line.replaceChildren("The app has no identity for you: your answers will be refused.");
        return;
      }
      const note =
        mode === "dev" ? " (development mode: the identity is asserted, not verified)" : "";
      line.replaceChildren("You answer as ", el("strong", { id: "identity" }, identity), note);
    } catch (error) {
      line.replaceChildren(`Could not tell who you answer as: ${str(error && error.message)}`);
    }
  }

  // ---------------------------------------------------------------------------------------
  // Results: one list item per answer, kept however the inbox changes.

  const RESULT_LABELS = { ok: "Done", refused: "Refused", unknown: "No answer" };

  function addResult(kind, what, ...body) {
    $("no-results").hidden = true;
    const item = el(
      "li",
      { class: `result ${kind}` },
      el("strong", {}, RESULT_LABELS[kind]),
      " ",
      what,
      ": ",
      ...body
    );
    results.prepend(item);
    return item;
  }

  const ACTIONS = { approve: "approve", deny: "deny", edit: "edit", respond: "respond to" };

  /** What an answer was, in words: the call's summary where it has one (its tool's name
   * otherwise), never its ref. */
  function describe(chatId, entry, action) {
    const summary = entry.shown && typeof entry.shown === "object" ? str(entry.shown.summary) : "";
    const what = summary ? `“${summary}” (${str(entry.name)})` : str(entry.name);
    return `${ACTIONS[action] || action} ${what} in ${chatId}`;
  }

  function showTurn(what, result) {
    const turn = result && typeof result === "object" ? result : {};
    const parts = [el("span", { class: "finish" }, `finished ${str(turn.finish_reason)}`)];
    if (turn.text) parts.push(": ", el("q", { class: "text" }, str(turn.text)));
    if (turn.error && typeof turn.error === "object") {
      parts.push(" (error: ", el("span", { class: "error" }, str(turn.error.message)), ")");
    }
    const pending = Array.isArray(turn.interrupts) ? turn.interrupts.length : 0;
    if (pending) parts.push(`; it waits on ${pending} call${pending === 1 ? "" : "s"} again`);
    addResult("ok", what, ...parts);
  }

  // ---------------------------------------------------------------------------------------
  // Answering.

  // Rows answered from this page, by key: shown as answered while the (lagging) inbox still
  // lists them, so that they are not offered again.
  const answered = new Set();

  /** Send one answer: ``extra`` is the deny's reason, the edit's input or the respond's
   * output. */
  async function answer(row, action, extra = {}) {
    const { chatId, entry } = row;
    const what = describe(chatId, entry, action);
    row.busy = true;
    setButtons(row, false, "Sending…");
    const body = { action, input_digest: str(entry.input_digest), ...extra };
    // "Remember for this tool": a grant with no conditions, until revoked (the conversation
    // checks that this approver may grant it).
    const remember = action === "approve" && row.remember !== undefined && row.remember.checked;
    if (remember) body.remember = { match: [] };
    let response;
    try {
      response = await fetch(
        api(`chats/${encodeURIComponent(chatId)}/interrupts/${encodeURIComponent(entry.ref)}`),
        {
          method: "POST",
          headers: { "Content-Type": "application/json", Accept: "application/json" },
          body: JSON.stringify(body),
        }
      );
    } catch (error) {
      // The request may have reached the app before the connection broke: say so rather
      // than offer it again as if nothing happened.
      addResult(
        "unknown",
        what,
        `no answer from the app (${str(error && error.message)}); it may have been applied, ` +
          "the list will show"
      );
      row.busy = false;
      setButtons(row, true, "");
      return;
    }
    row.busy = false;
    if (response.ok) {
      let reply = null;
      try {
        reply = await response.json();
      } catch {
        reply = null;
      }
      answered.add(row.key);
      setButtons(row, false, "Answered");
      showTurn(what, reply && reply.result);
      if (remember) showGrants(chatId);
    } else {
      const problem = await problemOf(response);
      const item = addResult(
        "refused",
        what,
        el("span", { class: "status" }, `${problem.status} ${problem.title}`),
        " — ",
        el("span", { class: "detail" }, problem.detail)
      );
      if (problem.code) item.dataset.code = problem.code;
      // Refused as already answered or changed: this entry is stale, the next poll replaces it.
      setButtons(row, response.status !== 409, response.status === 409 ? "Refused" : "");
    }
    refreshSoon();
  }

  function setButtons(row, enabled, note) {
    for (const button of row.tr.querySelectorAll("button")) button.disabled = !enabled;
    // Approve stays off until the whole input is shown (see showWhole).
    if (row.approve) row.approve.disabled = !enabled || !row.approvable;
    row.note.textContent = note;
    if (!enabled) for (const form of row.tr.querySelectorAll("form")) form.hidden = true;
  }

  // ---------------------------------------------------------------------------------------
  // An input too large for the inbox's listing: shown whole before it can be approved.

  /** Fetch the call's whole input from the chat's pending calls, show it in the row, and
   * offer Approve only when it is the input the listing's digest names: an approval binds
   * the whole input, so it is never given on the strength of a placeholder. */
  async function showWhole(row) {
    row.show.disabled = true;
    row.note.textContent = "Fetching the whole input…";
    let found;
    try {
      found = await callOf(row);
    } catch (error) {
      row.note.textContent = `Could not fetch the whole input: ${str(error && error.message)}`;
      row.show.disabled = false;
      return;
    }
    if (found === null) {
      row.note.textContent =
        "The call's input is not the one listed (answered or changed since): wait for the list.";
      return;
    }
    row.whole = found.input ?? {};
    row.approvable = true;
    row.show.hidden = true;
    const cell = row.tr.querySelector("td.input");
    if (cell) cell.replaceWith(inputCell(row.chat, row.entry, row.whole));
    if (!row.busy) setButtons(row, true, "");
  }

  // ---------------------------------------------------------------------------------------
  // The chat's pending calls (GET /api/chats/{id}/pending): the whole input, whether the tool
  // is editable, its schemas. Asked once per chat per listing, by the rows that need it.

  let pendingAsked = new Map();

  function pendingOf(chatId) {
    let asked = pendingAsked.get(chatId);
    if (asked === undefined) {
      asked = (async () => {
        const response = await fetch(api(`chats/${encodeURIComponent(chatId)}/pending`), {
          headers: { Accept: "application/json" },
        });
        if (!response.ok) throw new Error((await problemOf(response)).detail);
        const listing = await response.json();
        return Array.isArray(listing.interrupts) ? listing.interrupts : [];
      })();
      pendingAsked.set(chatId, asked);
      asked.catch(() => pendingAsked.delete(chatId));
    }
    return asked;
  }

  /** The row's call as the chat holds it now, or null when it is not the one listed (answered,
   * or its input changed since: its digest is not the listing's). Throws when the chat could
   * not be asked. */
  async function callOf(row) {
    const { chatId, entry } = row;
    const calls = await pendingOf(chatId);
    const path = JSON.stringify(Array.isArray(entry.path) ? entry.path.map(str) : []);
    const same = (call) =>
      call &&
      str(call.ref) === str(entry.ref) &&
      JSON.stringify(Array.isArray(call.path) ? call.path.map(str) : []) === path;
    const found = calls.find(same) ?? null;
    if (
      found === null ||
      !entry.input_digest ||
      str(found.input_digest) !== str(entry.input_digest) ||
      found.input_cut
    ) {
      return null;
    }
    return found;
  }

  // ---------------------------------------------------------------------------------------
  // Forms made from a JSON schema: an edit's input (the tool's input schema; without one, the
  // shape of the input itself) and a respond's output (the interrupt-only tool's output
  // schema). Strings, numbers, integers, booleans and enums get their own controls; anything
  // else is JSON in a text area, parsed here and checked again by the conversation.

  const MAX_FORM_FIELDS = 50;
  const own = (object, key) => Object.prototype.hasOwnProperty.call(object, key);
  const isObject = (value) => value !== null && typeof value === "object" && !Array.isArray(value);

  /** A key as words for a label, as the conversation writes them: ``payeeIban`` and
   * ``payee_iban`` read "Payee iban". */
  function words(key) {
    const spaced = str(key)
      .replace(/([a-z0-9])([A-Z])/g, "$1 $2")
      .replace(/[_-]/g, " ")
      .split(/\s+/)
      .filter(Boolean)
      .join(" ")
      .toLowerCase();
    return spaced.charAt(0).toUpperCase() + spaced.slice(1);
  }

  function resolve(node, root) {
    for (let i = 0; i < 8; i++) {
      const ref = isObject(node) ? node.$ref : undefined;
      if (typeof ref !== "string" || !ref.startsWith("#/$defs/")) return node;
      const defs = isObject(root.$defs) ? root.$defs : {};
      const name = ref.slice("#/$defs/".length);
      node = own(defs, name) ? defs[name] : undefined;
    }
    return node;
  }

  /** A property's control: string, number, integer, boolean, enum, or json; and whether
   * null fits it. */
  function controlOf(node, root, depth = 0) {
    node = resolve(node, root);
    if (!isObject(node) || depth > 4) return { kind: "json", node: {}, nullable: false };
    for (const key of ["anyOf", "oneOf"]) {
      if (!Array.isArray(node[key])) continue;
      const options = node[key].map((o) => resolve(o, root)).filter(isObject);
      const real = options.filter((o) => o.type !== "null");
      if (real.length !== 1) return { kind: "json", node, nullable: real.length < options.length };
      const inner = controlOf(real[0], root, depth + 1);
      const merged = { ...inner.node };
      for (const k of ["title", "description", "default"]) if (own(node, k)) merged[k] = node[k];
      const nullable = inner.nullable || real.length < options.length;
      return { kind: inner.kind, node: merged, nullable };
    }
    const plain = (v) => ["string", "number", "boolean"].includes(typeof v);
    if (Array.isArray(node.enum) && node.enum.length && node.enum.every(plain)) {
      return { kind: "enum", node, nullable: false };
    }
    let type = node.type;
    let nullable = false;
    if (Array.isArray(type)) {
      const real = type.filter((t) => t !== "null");
      nullable = real.length < type.length;
      type = real.length === 1 ? real[0] : undefined;
    }
    if (["string", "number", "integer", "boolean"].includes(type)) {
      return { kind: type, node, nullable };
    }
    return { kind: "json", node, nullable };
  }

  /** The schema of an input's own shape: each key, typed by its value, required. */
  function schemaOfValue(value) {
    const properties = Object.create(null);
    const typeOf = (v) => (["string", "number", "boolean"].includes(typeof v) ? typeof v : null);
    for (const key of Object.keys(value)) {
      const type = typeOf(value[key]);
      properties[key] = type ? { type } : {};
    }
    return { type: "object", properties, required: Object.keys(value) };
  }

  /** One control of a schema form, and how to read it: ``{value}``, ``{omit: true}`` or
   * ``{error}``. */
  function control(key, spec, { id, required, current, has }) {
    const { kind, node, nullable } = spec;
    const label = str(node.title) || words(key);
    const value = has ? current : node.default;
    const wrap = (input, ...more) =>
      el(
        "div",
        { class: `field field-${kind}` },
        el("label", { for: id }, label, required ? " (required)" : ""),
        input,
        node.description ? el("div", { class: "hint" }, str(node.description)) : null,
        ...more
      );
    const missing = () => (required ? { error: `${label} is required` } : { omit: true });
    if (kind === "boolean") {
      const box = el("input", { type: "checkbox", id });
      box.checked = value === true;
      return {
        node: el(
          "div",
          { class: "field field-boolean" },
          box,
          " ",
          el("label", { for: id }, label)
        ),
        read: () => ({ value: box.checked }),
      };
    }
    if (kind === "enum") {
      const select = el("select", { id, "aria-required": required ? "true" : null });
      if (!required || !has) {
        select.append(el("option", { value: "" }, required ? "Choose…" : "(none)"));
      }
      for (const option of node.enum) {
        const item = el("option", { value: JSON.stringify(option) }, str(option));
        if (value !== undefined && JSON.stringify(value) === JSON.stringify(option)) {
          item.selected = true;
        }
        select.append(item);
      }
      return {
        node: wrap(select),
        read: () => (select.value === "" ? missing() : { value: JSON.parse(select.value) }),
      };
    }
    if (kind === "number" || kind === "integer") {
      const input = el("input", {
        type: "number",
        id,
        step: kind === "integer" ? "1" : "any",
        min: typeof node.minimum === "number" ? node.minimum : null,
        max: typeof node.maximum === "number" ? node.maximum : null,
        "aria-required": required ? "true" : null,
      });
      if (typeof value === "number") input.value = String(value);
      return {
        node: wrap(input),
        read: () => {
          const text = input.value.trim();
          if (text === "") return nullable && has && current === null ? { value: null } : missing();
          const number = Number(text);
          if (!Number.isFinite(number)) return { error: `${label} is not a number` };
          if (kind === "integer" && !Number.isInteger(number)) {
            return { error: `${label} is a whole number` };
          }
          return { value: number };
        },
      };
    }
    if (kind === "string") {
      const long = typeof value === "string" && (value.length > 80 || value.includes("\n"));
      const input = long
        ? el("textarea", { id, rows: 3 })
        : el("input", { type: "text", id, autocomplete: "off" });
      if (typeof node.maxLength === "number") {
        input.setAttribute("maxlength", String(node.maxLength));
      }
      if (required) input.setAttribute("aria-required", "true");
      if (typeof value === "string") input.value = value;
      return {
        node: wrap(input),
        read: () => {
          if (input.value !== "" || required) return { value: input.value };
          return nullable && has && current === null ? { value: null } : { omit: true };
        },
      };
    }
    // Anything else (an object, a list, a choice of shapes): JSON, checked when sent.
    const area = el("textarea", { id, rows: 4, class: "json-input", spellcheck: "false" });
    if (value !== undefined) area.value = JSON.stringify(value, null, 2);
    const type = node.type;
    return {
      node: wrap(area),
      read: () => {
        const text = area.value.trim();
        if (text === "") return missing();
        let parsed;
        try {
          parsed = JSON.parse(text);
        } catch (error) {
          return { error: `${label} is not JSON: ${str(error && error.message)}` };
        }
        if (type === "object" && !isObject(parsed)) return { error: `${label} is a JSON object` };
        if (type === "array" && !Array.isArray(parsed)) return { error: `${label} is a JSON list` };
        return { value: parsed };
      },
    };
  }

  /** The controls of an object schema, filled with ``values``, and how to read the object
   * they make (``{value}`` or ``{error}``). Keys of ``values`` the schema does not list are
   * kept as they are. A schema with no properties (or too many) is one JSON text area. */
  function schemaForm(schema, values, prefix) {
    const root = isObject(schema) ? schema : {};
    const top = resolve(root, root);
    const props = isObject(top) && isObject(top.properties) ? top.properties : null;
    const current = isObject(values) ? values : {};
    const keys = props ? Object.keys(props) : [];
    if (!props || !keys.length || keys.length > MAX_FORM_FIELDS) {
      const spec = {
        kind: "json",
        node: { type: "object", title: "As JSON (an object)" },
        nullable: false,
      };
      const whole = control("value", spec, {
        id: `${prefix}-json`,
        required: true,
        current,
        has: true,
      });
      return { nodes: [whole.node], read: whole.read };
    }
    const required = new Set(Array.isArray(top.required) ? top.required.map(str) : []);
    const controls = keys.map((key, i) => {
      const has = own(current, key);
      const made = control(key, controlOf(props[key], root), {
        id: `${prefix}-${i}`,
        required: required.has(key),
        current: has ? current[key] : undefined,
        has,
      });
      return { key, ...made };
    });
    const read = () => {
      const out = Object.create(null);
      for (const key of Object.keys(current)) if (!own(props, key)) out[key] = current[key];
      for (const { key, read: readOne } of controls) {
        const got = readOne();
        if (got.error) return got;
        if (!got.omit) out[key] = got.value;
      }
      return { value: out };
    };
    return { nodes: controls.map((c) => c.node), read };
  }

  /** An edit or a respond form in a row: built from the call's schema when first opened. */
  function schemaAnswer(row, { kind, open, title, sendLabel, sendName, build }) {
    const label = `${str(row.entry.name)} in ${row.chatId}`;
    const form = el("form", { class: `${kind}-form`, hidden: true, novalidate: true });
    const problem = el("p", { class: "form-problem", role: "alert" });
    let made = null;
    const close = el("button", { type: "button" }, "Cancel");
    close.addEventListener("click", () => {
      form.hidden = true;
      open.focus();
    });
    open.addEventListener("click", async () => {
      if (!form.hidden) return;
      form.hidden = false;
      if (made !== null) return;
      form.replaceChildren(el("p", { class: "note" }, "Fetching the call…"));
      let call;
      try {
        call = await callOf(row);
      } catch (error) {
        form.replaceChildren(
          el(
            "p",
            { class: "form-problem" },
            `Could not fetch the call: ${str(error && error.message)}`
          ),
          close
        );
        return;
      }
      if (call === null) {
        form.replaceChildren(
          el(
            "p",
            { class: "form-problem" },
            "The call is not the one listed (answered or changed since): wait for the list."
          ),
          close
        );
        return;
      }
      made = build(call, `${kind}-${row.serial}`);
      const send = el("button", { type: "submit", "aria-label": sendName(label) }, sendLabel);
      const heading = el("div", { class: "form-title" }, title);
      form.replaceChildren(heading, ...made.nodes, problem, send, " ", close);
      const first = form.querySelector("input, select, textarea");
      if (first) first.focus();
    });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      if (made === null) return;
      const got = made.read();
      if (got.error) {
        problem.textContent = got.error;
        return;
      }
      problem.textContent = "";
      const extra = kind === "edit" ? { input: got.value } : { output: got.value };
      answer(row, kind, extra);
    });
    return form;
  }

  /** Edit (an editable tool: run it with another input) and Respond (an interrupt-only tool or
   * a server's form: answer with its output), when the row's call takes them. */
  function offerForms(row, cell) {
    const { entry } = row;
    const label = `${str(entry.name)} in ${row.chatId}`;
    const button = (text, attrs) => el("button", { type: "button", ...attrs }, text);
    const place = el("div", { class: "more-answers" });
    cell.insertBefore(place, row.note);
    if (entry.source === "interrupt" || entry.source === "input") {
      const open = button("Respond", { class: "respond", "aria-label": `Respond to ${label}` });
      const form = schemaAnswer(row, {
        kind: "respond",
        open,
        title: "Answer with the tool's output",
        sendLabel: "Send the answer",
        sendName: (label) => `Send the answer to ${label}`,
        build: (call, prefix) => schemaForm(call.output_schema, {}, prefix),
      });
      place.append(open, form);
      return;
    }
    // Whether the tool is editable is the chat's to say (the inbox's listing does not).
    callOf(row)
      .then((call) => {
        if (call === null || !call.editable || answered.has(row.key)) return;
        const open = button("Edit", { class: "edit", "aria-label": `Edit the input of ${label}` });
        open.disabled = row.busy;
        const form = schemaAnswer(row, {
          kind: "edit",
          open,
          title: "Run it with this input instead",
          sendLabel: "Run with this input",
          sendName: (label) => `Run ${label} with this input`,
          build: (found, prefix) => {
            const input = isObject(found.input) ? found.input : {};
            const schema = isObject(found.input_schema) ? found.input_schema : schemaOfValue(input);
            return schemaForm(schema, input, prefix);
          },
        });
        place.append(open, form);
      })
      .catch(() => {
        // No edit offered: the chat could not be asked (no worker, say); approve and deny
        // still work from the listing.
      });
  }

  function actionsCell(row) {
    const { chatId, entry } = row;
    const label = `${str(entry.name)} in ${chatId}`;
    const button = (text, attrs) => el("button", { type: "button", ...attrs }, text);
    const approve = button("Approve", { class: "approve", "aria-label": `Approve ${label}` });
    const deny = button("Deny", { class: "deny", "aria-label": `Deny ${label}` });
    const reasonId = `reason-${row.serial}`;
    const reason = el("input", { type: "text", id: reasonId, maxlength: 1000 });
    reason.autocomplete = "off";
    const send = button("Send denial", {
      type: "submit",
      "aria-label": `Send the denial of ${label}`,
    });
    const cancel = button("Cancel", {});
    const form = el(
      "form",
      { class: "deny-form", hidden: true },
      el("label", { for: reasonId }, "Reason (optional)"),
      reason,
      send,
      cancel
    );
    const note = el("span", { class: "note", role: "status" });
    approve.addEventListener("click", () => answer(row, "approve"));
    deny.addEventListener("click", () => {
      form.hidden = false;
      reason.focus();
    });
    cancel.addEventListener("click", () => {
      form.hidden = true;
      deny.focus();
    });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      answer(row, "deny", { reason: reason.value });
    });
    row.denyForm = form;
    row.note = note;
    row.approve = approve;
    // The answer must name the digest of the input shown, which only the app computes.
    const answerable = entry.ref !== "?" && Boolean(entry.input_digest);
    // A placeholder is not the input: Approve waits until the whole one is shown. (Deny
    // runs nothing, and needs no more than the listing shows.)
    row.approvable = answerable && (!entry.input_cut || row.whole !== undefined);
    const cell = el("td", { class: "actions" }, approve, " ", deny, form, note);
    // Only the approval of a call a gate paused can be remembered (not an interrupt's answer,
    // and not a sub-agent's call, which its own chat's rules decide).
    const own = !entry.chat_id || entry.chat_id === chatId;
    if (entry.source === "approval" && own) {
      const rememberId = `remember-${row.serial}`;
      row.remember = el("input", { type: "checkbox", id: rememberId, class: "remember" });
      cell.append(
        el(
          "div",
          { class: "remember" },
          row.remember,
          " ",
          el("label", { for: rememberId }, "Remember for this tool")
        )
      );
    }
    if (answerable && !row.approvable) {
      const show = button("Show the whole input", {
        class: "show-whole",
        "aria-label": `Show the whole input of ${label}`,
      });
      show.addEventListener("click", () => showWhole(row));
      row.show = show;
      cell.prepend(show, " ");
      approve.disabled = true;
    }
    if (answerable) offerForms(row, cell);
    if (!answerable) {
      approve.disabled = deny.disabled = true;
      note.textContent =
        "This entry cannot be answered here: answer it from the chat's pending calls.";
    }
    return cell;
  }

  // ---------------------------------------------------------------------------------------
  // The list.

  /** key -> {key, tr, chatId, entry, busy, ...}: rows are kept (focus, a reason being typed)
   * as long as their entry is listed with the same input; only their other cells change. */
  const rows = new Map();
  let serial = 0;

  const keyOf = (chatId, entry) =>
    JSON.stringify([chatId, str(entry.ref), str(entry.input_digest), str(entry.since)]);

  const RISKS = ["low", "medium", "high", "critical"];

  /** What a person is shown of the call (the conversation wrote it: ``InterruptRequest.shown``),
   * or null for an entry written before there was. */
  const shownOf = (entry) => (isObject(entry.shown) ? entry.shown : null);

  /** The call as a person reads it: the summary as the headline, the tool's risk, why it
   * waits, who asked, the user's request and the model's words. */
  function callCell(chat, entry) {
    const shown = shownOf(entry);
    const cell = el("td", { class: "tool" });
    const headline = el("div", { class: "summary" }, shown ? str(shown.summary) : str(entry.name));
    cell.append(headline);
    if (shown && shown.risk) {
      const risk = RISKS.includes(shown.risk) ? shown.risk : "unknown";
      cell.append(
        el(
          "div",
          { class: "risk-line" },
          el("span", { class: `risk risk-${risk}` }, `${str(shown.risk)} risk`),
          shown.risk_note ? el("span", { class: "risk-note" }, " ", str(shown.risk_note)) : null
        )
      );
    }
    if (shown && shown.why) cell.append(el("p", { class: "why" }, str(shown.why)));
    const requester = isObject(entry.requester) ? entry.requester : null;
    if (requester) {
      cell.append(
        el(
          "div",
          { class: "requester" },
          "Requested by ",
          el("strong", { class: "who" }, str(requester.identity)),
          requester.verified ? " (verified)" : " (asserted, not verified)"
        )
      );
    }
    if (shown && shown.asked) {
      cell.append(
        el("div", { class: "label" }, "The user asked"),
        el("blockquote", { class: "asked" }, str(shown.asked))
      );
    }
    if (shown && shown.said) {
      cell.append(
        el("div", { class: "label" }, "The model said"),
        el("blockquote", { class: "said" }, str(shown.said))
      );
    }
    const parts = [
      el("div", { class: "name-line" }, "tool ", el("code", { class: "name" }, str(entry.name))),
      // A sub-agent's call (agent_tool): answered here, through this chat, by the sub-agent's
      // rules; it waits in the sub-agent's own chat, reached by the path's refs.
      entry.chat_id && entry.chat_id !== chat.chat_id
        ? el(
            "div",
            { class: "sub-agent" },
            "in sub-agent ",
            el("code", {}, str(entry.chat_id)),
            Array.isArray(entry.path) && entry.path.length
              ? el("div", { class: "path" }, `path ${entry.path.map(str).join(" → ")}`)
              : null
          )
        : null,
      entry.source
        ? el("div", { class: "source" }, SOURCES[entry.source] || str(entry.source))
        : null,
    ];
    cell.append(...parts.filter(Boolean));
    return cell;
  }

  /** The call's input: the fields as the tool shows them, and the raw JSON (with the ref and
   * any metadata) behind a "details" disclosure, opened when the whole input was asked for. */
  function inputCell(chat, entry, whole) {
    const shown = shownOf(entry);
    const cell = el("td", { class: "input" });
    const fields = shown && Array.isArray(shown.fields) ? shown.fields.filter(isObject) : [];
    if (fields.length) {
      const list = el("dl", { class: "fields" });
      for (const field of fields) {
        list.append(el("dt", {}, str(field.label)), el("dd", {}, str(field.value)));
      }
      cell.append(list);
    }
    const omitted = shown ? Number(shown.fields_omitted) || 0 : 0;
    if (omitted > 0) {
      const plural = omitted === 1 ? "field" : "fields";
      cell.append(el("p", { class: "omitted" }, `${omitted} more ${plural} in the input`));
    }
    const raw = el(
      "details",
      { class: "raw", open: whole !== undefined || !shown },
      el("summary", {}, whole !== undefined ? "The whole input" : "Details: the input as JSON"),
      json(whole ?? entry.input ?? {}),
      el("div", { class: "ref" }, `ref ${str(entry.ref)}`)
    );
    const metadata = entry.metadata;
    if (isObject(metadata) && Object.keys(metadata).length) {
      raw.append(el("div", { class: "label" }, "metadata"), json(metadata));
    }
    cell.append(raw);
    if (whole !== undefined) {
      cell.append(el("p", { class: "whole" }, "The whole input, as the chat holds it."));
    } else if (entry.input_cut) {
      cell.append(
        el(
          "p",
          { class: "cut" },
          "Not the whole input (too large for the inbox): show it whole to approve it."
        )
      );
    }
    if (chat.unreadable) {
      cell.append(el("p", { class: "unreadable" }, `Unreadable: ${str(chat.unreadable)}`));
    }
    return cell;
  }

  function dataCells(chat, entry, whole) {
    const grantsButton = el(
      "button",
      {
        type: "button",
        class: "show-grants",
        "aria-label": `Show the grants of ${str(chat.chat_id)}`,
      },
      "Grants"
    );
    grantsButton.addEventListener("click", () => showGrants(str(chat.chat_id)));
    const chatCell = el(
      "td",
      { class: "chat" },
      el("code", {}, str(chat.chat_id)),
      chat.agent ? el("div", { class: "agent" }, "agent ", el("code", {}, str(chat.agent))) : null,
      grantsButton
    );
    const approvers = Array.isArray(entry.approvers) ? entry.approvers.map(str) : [];
    const approversCell = el(
      "td",
      { class: "approvers" },
      approvers.length ? el("ul", {}, ...approvers.map((a) => el("li", {}, a))) : "anyone",
      entry.approvers_omitted ? el("div", {}, `and ${Number(entry.approvers_omitted)} more`) : null
    );
    const votes = Array.isArray(entry.votes) ? entry.votes.map(str) : [];
    const votesCell = el(
      "td",
      { class: "votes" },
      el("span", { class: "count" }, `${votes.length} / ${Number(entry.quorum ?? 1)}`),
      votes.length
        ? el("ul", {}, ...votes.map((v) => el("li", {}, v === identity ? `${v} (you)` : v)))
        : null
    );
    const since = entry.since ?? chat.waiting_since;
    return [
      chatCell,
      callCell(chat, entry),
      inputCell(chat, entry, whole),
      approversCell,
      votesCell,
      el("td", { class: "deadline" }, timeEl(entry.deadline)),
      el("td", { class: "since" }, timeEl(since, { ago: true })),
    ];
  }

  /** What a row's data cells show, to leave a row alone (a selection in it) when nothing
   * changed. */
  function shownAs(chat, entry) {
    const since = entry.since ?? chat.waiting_since;
    const ago = since ? Math.round((Date.now() - new Date(since).getTime()) / 60000) : null;
    return JSON.stringify([{ ...chat, interrupts: null }, entry, identity, ago]);
  }

  function render(chats) {
    // New rows ask their chat's pending calls afresh (once per chat).
    pendingAsked = new Map();
    const wanted = [];
    const listed = new Set();
    for (const chat of chats) {
      const chatId = str(chat.chat_id);
      for (const entry of Array.isArray(chat.interrupts) ? chat.interrupts : []) {
        const key = keyOf(chatId, entry);
        if (listed.has(key)) continue;
        listed.add(key);
        let row = rows.get(key);
        if (row === undefined) {
          row = { key, chatId, chat, entry, busy: false, serial: serial++ };
          row.tr = el("tr", { "data-chat": chatId, "data-ref": str(entry.ref) });
          row.tr.append(...dataCells(chat, entry), actionsCell(row));
          rows.set(key, row);
          if (answered.has(key)) setButtons(row, false, "Answered");
          row.shown = shownAs(chat, entry);
        } else if (!row.busy && row.shown !== shownAs(chat, entry)) {
          // Same call, same input: refresh what may change (votes, deadline, how long ago), cell
          // by cell, so that the answer cell (its focus, a reason being typed) stays as it is.
          row.entry = entry;
          row.chat = chat;
          row.shown = shownAs(chat, entry);
          const cells = dataCells(chat, entry, row.whole);
          cells.forEach((cell, i) => row.tr.replaceChild(cell, row.tr.children[i]));
        }
        wanted.push(row.tr);
      }
    }
    for (const [key, row] of rows) {
      if (listed.has(key)) continue;
      if (row.busy) {
        wanted.push(row.tr); // its answer is on the way: keep it until the result shows
      } else {
        rows.delete(key);
      }
    }
    // Rows are removed and moved one by one, only where the order changed: moving a row takes
    // the focus from its buttons.
    const keep = new Set(wanted);
    for (const tr of Array.from(entriesBody.children)) if (!keep.has(tr)) tr.remove();
    wanted.forEach((tr, i) => {
      const there = entriesBody.children[i] ?? null;
      if (there !== tr) entriesBody.insertBefore(tr, there);
    });
    const count = listed.size;
    const when = new Date().toLocaleTimeString();
    const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
    statusLine.textContent = count
      ? `${plural(count, "paused call")} in ${plural(chats.length, "chat")} (updated ${when}).`
      : `Nothing is waiting on a human (updated ${when}).`;
  }

  // ---------------------------------------------------------------------------------------
  // Grants: one chat's remembered decisions, each with Revoke. Read when asked for (a button,
  // ?chat=, an approval that remembered), not polled: each read asks the chat's worker.

  const OPS = { eq: "=", prefix: "starts with", le: "≤", lt: "<", ge: "≥", gt: ">" };

  /** A grant's conditions in words, as agentctl and the UI's details panel show them. */
  function describeMatch(match) {
    if (!Array.isArray(match) || !match.length) return "every call";
    const one = (c) => {
      const condition = c && typeof c === "object" ? c : {};
      const op = OPS[condition.op] || str(condition.op);
      return `${str(condition.field)} ${op} ${JSON.stringify(condition.value ?? null)}`;
    };
    return match.map(one).join(" and ");
  }

  let grantsChat = null;

  async function showGrants(chatId) {
    grantsChat = chatId;
    $("grants-chat").value = chatId;
    const status = $("grants-status");
    status.textContent = "Loading the grants…";
    let listing;
    try {
      const response = await fetch(api(`chats/${encodeURIComponent(chatId)}/grants`), {
        headers: { Accept: "application/json" },
      });
      if (!response.ok) {
        const problem = await problemOf(response);
        status.textContent = `Could not read the grants of ${chatId}: ${problem.detail}`;
        $("grants").hidden = true;
        return;
      }
      listing = await response.json();
    } catch (error) {
      const why = str(error && error.message);
      status.textContent = `Could not read the grants of ${chatId}: ${why}`;
      return;
    }
    if (grantsChat !== chatId) return; // another chat was asked for since
    const grants = Array.isArray(listing.grants) ? listing.grants : [];
    $("grant-entries").replaceChildren(...grants.map((g) => grantRow(chatId, g)));
    $("grants-caption").textContent = `Grants in force on ${chatId}`;
    $("grants").hidden = !grants.length;
    status.textContent = grants.length
      ? `${grants.length} grant${grants.length === 1 ? "" : "s"} in force on ${chatId}.`
      : `No grants in force on ${chatId}.`;
  }

  function grantRow(chatId, grant) {
    const id = str(grant.id);
    const by = Array.isArray(grant.granted_by) ? grant.granted_by.map(str).join(", ") : "";
    const proof = grant.verified ? "verified" : "asserted";
    const revoke = el(
      "button",
      { type: "button", class: "revoke", "aria-label": `Revoke ${id} in ${chatId}` },
      "Revoke"
    );
    const note = el("span", { class: "note", role: "status" });
    revoke.addEventListener("click", () => revokeGrant(chatId, id, revoke, note));
    return el(
      "tr",
      { "data-grant": id },
      el("td", { class: "grant-id" }, el("code", {}, id)),
      el("td", { class: "tool" }, el("code", {}, str(grant.tool))),
      el("td", { class: "when" }, describeMatch(grant.match)),
      el("td", { class: "until" }, grant.until ? timeEl(grant.until) : "until revoked"),
      el("td", { class: "by" }, `${by || "unknown"} (${proof})`),
      el("td", { class: "uses" }, String(Number(grant.uses ?? 0))),
      el("td", { class: "actions" }, revoke, " ", note)
    );
  }

  async function revokeGrant(chatId, grantId, button, note) {
    button.disabled = true;
    note.textContent = "Revoking…";
    const what = `revoke ${grantId} in ${chatId}`;
    let response;
    try {
      response = await fetch(
        api(`chats/${encodeURIComponent(chatId)}/grants/${encodeURIComponent(grantId)}/revoke`),
        {
          method: "POST",
          headers: { "Content-Type": "application/json", Accept: "application/json" },
          body: JSON.stringify({ reason: "revoked from the inbox page" }),
        }
      );
    } catch (error) {
      addResult("unknown", what, `no answer from the app (${str(error && error.message)})`);
      button.disabled = false;
      note.textContent = "";
      return;
    }
    if (response.ok) {
      addResult("ok", what, "revoked: matching calls ask again");
    } else {
      const problem = await problemOf(response);
      const item = addResult(
        "refused",
        what,
        el("span", { class: "status" }, `${problem.status} ${problem.title}`),
        " — ",
        el("span", { class: "detail" }, problem.detail)
      );
      if (problem.code) item.dataset.code = problem.code;
    }
    showGrants(chatId);
  }

  $("grants-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const chatId = $("grants-chat").value.trim();
    if (chatId) showGrants(chatId);
  });

  // ---------------------------------------------------------------------------------------
  // Polling.

  const filters = new URLSearchParams();
  for (const name of ["agent", "approver"]) {
    const value = new URLSearchParams(window.location.search).get(name);
    if (value) filters.set(name, value);
  }

  let timer = null;
  let loading = false;

  async function refresh() {
    timer = null;
    if (loading || document.hidden) return;
    loading = true;
    try {
      const url = api("inbox");
      url.search = filters.toString();
      const response = await fetch(url, {
        headers: { Accept: "application/json" },
        signal: AbortSignal.timeout(LIST_TIMEOUT_MS),
      });
      if (response.ok) {
        const listing = await response.json();
        render(Array.isArray(listing.chats) ? listing.chats : []);
        if (listing.next_cursor) {
          // One page of the inbox: the rest is for a narrower listing (?agent=, ?approver=).
          statusLine.textContent +=
            " More paused chats than one page holds: narrow the list with ?agent= or ?approver=.";
        }
      } else {
        const problem = await problemOf(response);
        statusLine.textContent = `Could not refresh the list: ${problem.detail}`;
      }
    } catch (error) {
      statusLine.textContent = `Could not refresh the list: ${str(error && error.message)}`;
    } finally {
      loading = false;
      schedule(POLL_MS);
    }
  }

  function schedule(delay) {
    if (timer !== null) clearTimeout(timer);
    timer = document.hidden ? null : setTimeout(refresh, delay);
  }

  function refreshSoon() {
    if (!loading) schedule(0);
  }

  document.addEventListener("visibilitychange", () => {
    if (document.hidden) {
      if (timer !== null) clearTimeout(timer);
      timer = null;
    } else {
      refreshSoon();
    }
  });

  const asked = new URLSearchParams(window.location.search).get("chat");
  if (asked) showGrants(asked);

  showWhoami().finally(refresh);
})();
