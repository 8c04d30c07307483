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

  function describe(chatId, entry, action) {
    return `${action} ${str(entry.name)} (ref ${str(entry.ref)}) in ${chatId}`;
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

  async function answer(row, action, reason) {
    const { chatId, entry } = row;
    const what = describe(chatId, entry, action === "approve" ? "approve" : "deny");
    row.busy = true;
    setButtons(row, false, "Sending…");
    const body = { action, input_digest: str(entry.input_digest) };
    if (action === "deny") body.reason = reason;
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
    if (!enabled) row.denyForm.hidden = true;
  }

  // ---------------------------------------------------------------------------------------
  // An input too large for the inbox's listing: shown whole before it can be approved.

  /** Fetch the call's whole input from the chat's pending calls, show it in the row, and
   * offer Approve only when it is the input the listing's digest names: an approval binds
   * the whole input, so it is never given on the strength of a placeholder. */
  async function showWhole(row) {
    const { chatId, entry } = row;
    row.show.disabled = true;
    row.note.textContent = "Fetching the whole input…";
    let found = null;
    try {
      const response = await fetch(api(`chats/${encodeURIComponent(chatId)}/pending`), {
        headers: { Accept: "application/json" },
      });
      if (!response.ok) {
        const problem = await problemOf(response);
        row.note.textContent = `Could not fetch the whole input: ${problem.detail}`;
        row.show.disabled = false;
        return;
      }
      const listing = await response.json();
      const calls = Array.isArray(listing.interrupts) ? listing.interrupts : [];
      const path = JSON.stringify(Array.isArray(entry.path) ? entry.path.map(str) : []);
      const same = (call) =>
        call &&
        str(call.ref) === str(entry.ref) &&
        JSON.stringify(Array.isArray(call.path) ? call.path.map(str) : []) === path;
      found = calls.find(same) ?? null;
    } catch (error) {
      row.note.textContent = `Could not fetch the whole input: ${str(error && error.message)}`;
      row.show.disabled = false;
      return;
    }
    if (
      found === null ||
      !entry.input_digest ||
      str(found.input_digest) !== str(entry.input_digest) ||
      found.input_cut
    ) {
      row.note.textContent =
        "The call's input is not the one listed (answered or changed since): wait for the list.";
      return;
    }
    row.whole = found.input ?? {};
    row.approvable = true;
    row.show.hidden = true;
    const cell = row.tr.querySelector("td.input");
    if (cell) cell.replaceWith(inputCell(row.chat, entry, row.whole));
    if (!row.busy) setButtons(row, true, "");
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
      answer(row, "deny", reason.value);
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

  function inputCell(chat, entry, whole) {
    const cell = el("td", { class: "input" }, json(whole ?? entry.input ?? {}));
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
    const metadata = entry.metadata;
    if (metadata && typeof metadata === "object" && Object.keys(metadata).length) {
      cell.append(el("div", { class: "label" }, "metadata"), json(metadata));
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
    const toolCell = el(
      "td",
      { class: "tool" },
      el("code", { class: "name" }, str(entry.name)),
      el("div", { class: "ref" }, `ref ${str(entry.ref)}`),
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
        : null
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
      toolCell,
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
