// The web chat page: the person's sessions, a message box, the answer streaming in (POST with
// Accept: text/event-stream, read from the fetch body: EventSource cannot POST), Markdown rendered by markdown.js
// (text nodes only), tool activity as a collapsible "steps" part, a message's buttons (a reminder's Done and Snooze,
// Undo under /remind's answer, a command's confirmation or choice), tasks and memory in a side panel.
// Every request is relative (the page may live under a proxy's path prefix) and carries the sign-in cookie; every
// change also carries the sign-in's CSRF token in X-CSRF-Token (GET v1/me gives it).

import { renderMarkdown } from "./markdown.js";

const REFRESH_MS = 30_000; // an open session's messages are read again this often (reminders arrive there)
const RESUME_TRIES = 3; // a stream cut short is resumed by Last-Event-ID this many times
const TITLE_CHARS = 60; // a new session's title: the first message's start

const state = {
  csrf: null,
  sessions: [],
  current: null, // the open session's id (null: a new chat, made by its first message)
  messages: [], // the open session's messages, oldest first
  before: null, // the cursor of the page before the shown ones
  streaming: false,
  openSteps: new Set(), // ids of messages whose steps are unfolded
};

const $ = (id) => document.getElementById(id);

class SignedOut extends Error {}

function show(id, visible) {
  $(id).hidden = !visible;
}

function notice(text, isError = false) {
  const line = $("notice");
  line.textContent = text || "";
  line.classList.toggle("error", Boolean(isError));
}

// ---- requests ----------------------------------------------------------------------------------------------------

async function errorLine(response) {
  try {
    const body = await response.json();
    return body?.error?.message || `${response.status} ${response.statusText}`;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

async function request(method, path, body, accept = "application/json") {
  const headers = { Accept: accept };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && state.csrf) headers["X-CSRF-Token"] = state.csrf;
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
    cache: "no-store",
  });
  if (response.status === 401) {
    signedOut();
    throw new SignedOut();
  }
  if (!response.ok) throw new Error(await errorLine(response));
  return response;
}

async function json(method, path, body) {
  const response = await request(method, path, body);
  return response.status === 204 ? null : response.json();
}

/** The events of a Server-Sent Events body: {id, event, data}. */
async function* sseEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const event = { id: null, event: "message", data: [] };
      for (const line of block.split("\n")) {
        if (!line || line.startsWith(":")) continue; // a keep-alive comment
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") event.event = value;
        else if (field === "data") event.data.push(value);
        else if (field === "id") event.id = value;
      }
      if (event.data.length) yield { id: event.id, event: event.event, data: JSON.parse(event.data.join("\n")) };
    }
  }
}

// ---- messages ----------------------------------------------------------------------------------------------------

function toolLine(call, result) {
  const action = call.args?.action ?? call.args?.mode;
  const label = typeof action === "string" ? `${call.name} ${action}` : call.name;
  if (!result) return `${label} → running`;
  let outcome = result.ok ? "ok" : "failed";
  try {
    const envelope = JSON.parse(result.result);
    const summary = envelope?.result?.summary ?? envelope?.error?.message;
    if (typeof summary === "string" && summary) outcome = `${outcome}: ${summary}`;
  } catch {
    // a long result is cut: no summary to show
  }
  return `${label} → ${outcome}`;
}

function stepsOf(message, parts) {
  const calls = parts.filter((p) => p.type === "tool_call");
  if (!calls.length) return null;
  const results = new Map(parts.filter((p) => p.type === "tool_result").map((p) => [p.call_id, p]));
  const details = document.createElement("details");
  details.className = "steps";
  details.open = state.openSteps.has(message.id);
  details.addEventListener("toggle", () => {
    if (details.open) state.openSteps.add(message.id);
    else state.openSteps.delete(message.id);
  });
  const summary = document.createElement("summary");
  const finished = parts.filter((p) => p.type === "tool_result").map((p) => Date.parse(p.finished_at));
  const started = Date.parse(message.created_at);
  const seconds = finished.length && started ? Math.max(0, (Math.max(...finished) - started) / 1000) : null;
  const count = `${calls.length} step${calls.length === 1 ? "" : "s"}`;
  summary.textContent = seconds === null ? count : `${count} · ${seconds.toFixed(1)} s`;
  details.append(summary);
  const list = document.createElement("ul");
  for (const call of calls) {
    const item = document.createElement("li");
    const result = results.get(call.call_id);
    item.textContent = toolLine(call, result);
    item.className = !result ? "running" : result.ok ? "ok" : "failed";
    list.append(item);
  }
  details.append(list);
  return details;
}

function renderMessage(message) {
  const box = document.createElement("article");
  box.className = `message ${message.role} ${message.status || ""}`.trim();
  box.dataset.id = message.id;
  const parts = (message.parts || []).filter(Boolean);
  const text = parts
    .filter((p) => p.type === "text")
    .map((p) => p.text)
    .join("\n\n");
  if (message.role === "user") {
    const body = document.createElement("div");
    body.className = "body plain";
    body.textContent = text;
    box.append(body);
    return box;
  }
  const body = document.createElement("div");
  body.className = "body md";
  if (message.role === "reminder") body.append(renderMarkdown(text));
  else if (text) body.append(renderMarkdown(text));
  else if (message.status === "running") body.append(Object.assign(document.createElement("span"), { className: "typing", textContent: "…" }));
  box.append(body);
  for (const part of parts.filter((p) => p.type === "error")) {
    const line = document.createElement("p");
    line.className = "error";
    line.textContent = part.message;
    box.append(line);
  }
  const steps = stepsOf(message, parts);
  if (steps) box.append(steps);
  const buttons = buttonsOf(message);
  if (buttons) box.append(buttons);
  return box;
}

function buttonsOf(message) {
  const presses = [
    ...(message.buttons || []).map((b) => ({ label: b.label, body: { task_id: b.task_id, action: b.action } })),
    ...(message.choices || []).map((c) => ({ label: c.label, body: { press: c.press }, style: c.style })),
  ];
  if (!presses.length) return null;
  const row = document.createElement("div");
  row.className = "buttons";
  for (const button of presses) {
    const press = document.createElement("button");
    press.type = "button";
    press.textContent = button.label;
    if (button.style === "danger") press.className = "danger";
    press.addEventListener("click", () => pressButton(message, button.body, row));
    row.append(press);
  }
  return row;
}

/** Press a button under a message (a task's, or a confirmation's or choice's, which runs its command again): what it
 * did takes the buttons' place (the server keeps it under a reminder). */
async function pressButton(message, body, row) {
  const all = [...row.querySelectorAll("button")];
  for (const b of all) b.disabled = true;
  try {
    const path = `v1/sessions/${encodeURIComponent(message.session_id)}/messages/${encodeURIComponent(message.id)}/press`;
    const answer = await json("POST", path, body);
    const shown = state.messages.find((m) => m.id === message.id) || message;
    upsert({ ...shown, parts: [...shown.parts, { type: "text", text: answer.text }], buttons: [], choices: [] });
    await loadPanel();
  } catch (error) {
    for (const b of all) b.disabled = false;
    if (!(error instanceof SignedOut)) notice(error.message, true);
  }
}

function nearBottom() {
  const pane = $("messages");
  return pane.scrollHeight - pane.scrollTop - pane.clientHeight < 80;
}

function scrollDown() {
  const pane = $("messages");
  pane.scrollTop = pane.scrollHeight;
}

function renderMessages() {
  const stick = nearBottom();
  $("message-list").replaceChildren(...state.messages.map(renderMessage));
  show("earlier", Boolean(state.before));
  if (stick) scrollDown();
}

function upsert(message) {
  const stick = nearBottom();
  const at = state.messages.findIndex((m) => m.id === message.id);
  if (at >= 0) state.messages[at] = message;
  else state.messages.push(message);
  const node = renderMessage(message);
  const old = $("message-list").querySelector(`article[data-id="${CSS.escape(message.id)}"]`);
  if (old) old.replaceWith(node);
  else $("message-list").append(node);
  if (stick) scrollDown();
}

function onEvent({ event, data }) {
  if (event === "message.created" || event === "message.completed") {
    upsert({ ...data.message, live: true }); // seen live: a command's exchange is kept though never stored
    return;
  }
  const message = state.messages.find((m) => m.id === data.message_id);
  if (!message) return;
  const parts = [...message.parts];
  if (event === "message.part.delta") {
    const part = parts[data.part] || { type: "text", text: "" };
    parts[data.part] = { ...part, text: part.text + data.delta };
  } else if (event === "tool.call" || event === "tool.result") {
    const { message_id: _, part: index, ...part } = data;
    parts[index] = part;
  } else if (event === "error") {
    parts[data.part] = { type: "error", code: data.error.type, message: data.error.message };
  } else {
    return;
  }
  upsert({ ...message, parts });
}

/** Read an answer's events; a stream cut short (the network) is resumed where it was. Whether it completed. */
async function follow(sessionId, response) {
  let lastId = null;
  let completed = false;
  for (let tries = 0; ; tries += 1) {
    try {
      for await (const event of sseEvents(response.body)) {
        if (event.id) lastId = event.id;
        if (event.event === "message.completed") completed = true;
        if (state.current === sessionId) onEvent(event); // the person may have opened another chat meanwhile
      }
    } catch (error) {
      if (error instanceof SignedOut) throw error;
    }
    if (completed || tries >= RESUME_TRIES || state.current !== sessionId) return completed;
    const headers = { Accept: "text/event-stream" };
    if (lastId) headers["Last-Event-ID"] = lastId;
    response = await fetch(`v1/sessions/${encodeURIComponent(sessionId)}/stream`, { headers, cache: "no-store" });
    if (!response.ok) return false;
  }
}

async function send(text) {
  if (state.streaming) return;
  state.streaming = true;
  $("send").disabled = true;
  notice("");
  try {
    if (!state.current) {
      const made = await json("POST", "v1/sessions", { title: text.slice(0, TITLE_CHARS) });
      state.current = made.id;
      state.messages = [];
      state.before = null;
      location.hash = made.id;
      $("session-title").textContent = made.title || "New chat";
      renderMessages();
    }
    const sessionId = state.current;
    const response = await request(
      "POST",
      `v1/sessions/${encodeURIComponent(sessionId)}/messages`,
      { content: text },
      "text/event-stream",
    );
    $("input").value = "";
    if (!(await follow(sessionId, response)) && state.current === sessionId) await loadMessages(); // as stored
  } catch (error) {
    if (!(error instanceof SignedOut)) notice(error.message, true);
  } finally {
    state.streaming = false;
    $("send").disabled = false;
  }
  await Promise.all([loadSessions(), loadPanel()]).catch(() => {});
}

// ---- sessions ----------------------------------------------------------------------------------------------------

function renderSessions() {
  const items = state.sessions.map((s) => {
    const item = document.createElement("li");
    item.className = s.id === state.current ? "current" : "";
    const open = document.createElement("button");
    open.type = "button";
    open.className = "open";
    open.textContent = s.title || "Untitled chat";
    open.addEventListener("click", () => openSession(s.id));
    item.append(open);
    return item;
  });
  $("sessions").replaceChildren(...items);
}

async function loadSessions() {
  state.sessions = (await json("GET", "v1/sessions")).sessions;
  renderSessions();
}

/** The stored messages, with the exchanges of commands seen on this page (never stored) where they were shown. A
 * message streamed here stays as its events left it while the stored one is still running: a read that overlaps the
 * stream has the answer as it was (no steps yet, or none of its text) and would undo what the stream showed. */
function merged(stored, shown) {
  const live = new Map(shown.filter((m) => m.live).map((m) => [m.id, m]));
  const out = stored.map((m) => (m.status === "running" && live.has(m.id) ? live.get(m.id) : m));
  const ids = new Set(stored.map((m) => m.id));
  let after = null;
  for (const message of shown) {
    if (!ids.has(message.id) && message.live) {
      out.splice(after === null ? 0 : out.findIndex((m) => m.id === after) + 1, 0, message);
    }
    if (ids.has(message.id) || message.live) after = message.id;
  }
  return out;
}

async function loadMessages() {
  if (!state.current) return;
  const sessionId = state.current;
  const page = await json("GET", `v1/sessions/${encodeURIComponent(sessionId)}/messages`);
  if (state.current !== sessionId) return; // another chat was opened meanwhile
  state.messages = merged(page.messages, state.messages);
  state.before = page.before;
  renderMessages();
}

async function loadEarlier() {
  if (!state.current || !state.before) return;
  const id = encodeURIComponent(state.current);
  const page = await json("GET", `v1/sessions/${id}/messages?before=${encodeURIComponent(state.before)}`);
  const pane = $("messages");
  const fromBottom = pane.scrollHeight - pane.scrollTop;
  state.messages = [...page.messages, ...state.messages];
  state.before = page.before;
  renderMessages();
  pane.scrollTop = pane.scrollHeight - fromBottom;
}

async function openSession(id) {
  if (id !== state.current) {
    state.current = id;
    state.messages = [];
    state.before = null;
  } // the open one is read again, its streamed answer kept
  const found = state.sessions.find((s) => s.id === id);
  $("session-title").textContent = found?.title || "Untitled chat";
  history.replaceState(null, "", id ? `#${id}` : location.pathname);
  renderSessions();
  renderMessages();
  document.body.classList.remove("show-sessions");
  if (!id) return;
  try {
    await loadMessages();
  } catch (error) {
    if (!(error instanceof SignedOut)) notice(error.message, true);
  }
}

async function deleteSession() {
  if (!state.current || !confirm("Delete this chat and its messages?")) return;
  try {
    await json("DELETE", `v1/sessions/${encodeURIComponent(state.current)}`);
    await loadSessions();
    await openSession(null);
  } catch (error) {
    if (!(error instanceof SignedOut)) notice(error.message, true);
  }
}

async function reset() {
  if (!state.current || !confirm("Start this conversation afresh? Its messages stay here.")) return;
  try {
    const answer = await json("POST", `v1/sessions/${encodeURIComponent(state.current)}/reset`);
    notice(answer.text);
  } catch (error) {
    if (!(error instanceof SignedOut)) notice(error.message, true);
  }
}

// ---- the side panel ----------------------------------------------------------------------------------------------

async function loadPanel() {
  const [tasks, memory] = await Promise.all([json("GET", "v1/tasks"), json("GET", "v1/memory")]);
  $("tasks").replaceChildren(renderMarkdown(tasks.text));
  $("memory").replaceChildren(renderMarkdown(memory.text));
}

async function wipeMemory() {
  if (!confirm("Forget everything the bot remembers about you? This cannot be undone.")) return;
  try {
    const answer = await json("POST", "v1/memory/wipe");
    notice(answer.text);
    await loadPanel();
  } catch (error) {
    if (!(error instanceof SignedOut)) notice(error.message, true);
  }
}

// ---- signing in and out ------------------------------------------------------------------------------------------

function signedOut() {
  state.csrf = null;
  show("loading", false);
  show("app", false);
  show("signed-out", true);
}

async function signOut() {
  try {
    await request("POST", "signout");
  } catch (error) {
    if (!(error instanceof SignedOut)) {
      notice(error.message, true);
      return;
    }
  }
  signedOut();
}

async function refresh() {
  if (state.streaming || !state.csrf || document.hidden) return;
  try {
    await Promise.all([loadMessages(), loadPanel()]);
  } catch {
    // the next refresh tries again
  }
}

function toggle(className, button) {
  const on = document.body.classList.toggle(className);
  $(button).setAttribute("aria-expanded", String(on));
}

function wire() {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("input").value.trim();
    if (text) send(text);
  });
  $("input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("new-session").addEventListener("click", () => openSession(null));
  $("delete-session").addEventListener("click", deleteSession);
  $("reset").addEventListener("click", reset);
  $("wipe-memory").addEventListener("click", wipeMemory);
  $("sign-out").addEventListener("click", signOut);
  $("earlier").addEventListener("click", () => loadEarlier().catch((e) => notice(e.message, true)));
  $("toggle-sessions").addEventListener("click", () => toggle("show-sessions", "toggle-sessions"));
  $("toggle-panel").addEventListener("click", () => toggle("show-panel", "toggle-panel"));
  window.addEventListener("focus", refresh);
  document.addEventListener("visibilitychange", refresh);
  setInterval(refresh, REFRESH_MS);
}

async function start() {
  wire();
  let me;
  try {
    me = await json("GET", "v1/me");
  } catch (error) {
    if (!(error instanceof SignedOut)) {
      signedOut();
      $("signed-out-why").textContent = error.message; // e.g. no longer allowed to use the bot
    }
    return;
  }
  state.csrf = me.csrf;
  $("who").textContent = me.display_name;
  show("loading", false);
  show("signed-out", false);
  show("app", true);
  try {
    await Promise.all([loadSessions(), loadPanel()]);
    if (!state.streaming && !state.current) {
      // else the person sent a message meanwhile: that chat, its answer streaming in, stays open
      const wanted = decodeURIComponent(location.hash.slice(1));
      const known = state.sessions.some((s) => s.id === wanted);
      await openSession(known ? wanted : (state.sessions[0]?.id ?? null));
    }
  } catch (error) {
    if (!(error instanceof SignedOut)) notice(error.message, true);
  }
  $("input").focus();
}

start();
