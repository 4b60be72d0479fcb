// Status page: polls /api/status once a second; annotated previews arrive as JPEGs over /preview/ws.
// With server.token set, the token lives in this tab's sessionStorage (login.html puts it there) and travels as an
// Authorization header (fetch) or a WebSocket subprotocol (the one header a browser lets a page set on one), never
// in a URL: an old `?token=` link is moved into sessionStorage and taken out of the address bar.
"use strict";

const TOKEN_KEY = "emotion-pipeline.token";
const PREVIEW_PROTOCOL = "emotion-pipeline.preview";
const TOKEN_PROTOCOL = "emotion-pipeline.token.";
const tokenInUrl = new URLSearchParams(location.search).get("token");
if (tokenInUrl) {
  sessionStorage.setItem(TOKEN_KEY, tokenInUrl);
  history.replaceState(null, "", location.pathname);
}
const token = sessionStorage.getItem(TOKEN_KEY);
const headers = token ? { Authorization: "Bearer " + token } : {};
const tiles = new Map(); // camera name -> {root, img, frame, state, quality, figures}
const $ = (selector) => document.querySelector(selector);

// The token as a WebSocket subprotocol: base64url (letters, digits, - and _ are all a subprotocol may contain).
function tokenProtocol(value) {
  const bytes = String.fromCharCode(...new TextEncoder().encode(value));
  return TOKEN_PROTOCOL + btoa(bytes).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

// The footer's JSON links need the header too: fetch them and show what came back in a new tab.
for (const id of ["link-status", "link-metrics"]) {
  document.getElementById(id).addEventListener("click", async (event) => {
    if (!token) return;
    event.preventDefault();
    const response = await fetch(event.currentTarget.href, { headers, cache: "no-store" });
    window.open(URL.createObjectURL(await response.blob()), "_blank");
  });
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function tileFor(name) {
  let tile = tiles.get(name);
  if (tile) return tile;
  const root = el("article", "tile");
  root.dataset.camera = name;
  const head = el("div", "tile-head");
  const state = el("span", "badge state");
  const quality = el("span", "badge quality");
  const toggle = el("input", "switch");
  toggle.type = "checkbox";
  toggle.title = "camera on/off: saved in the configuration file and applied";
  toggle.addEventListener("change", () => switchCamera(name, toggle));
  head.append(el("span", "name", name), state, quality, toggle);
  const frame = el("div", "frame", "waiting for a frame…");
  frame.title = "click to enlarge";
  frame.addEventListener("click", () => root.classList.toggle("large"));
  const img = el("img", "preview");
  img.alt = "annotated preview of " + name;
  const figures = el("div", "figures");
  const failure = el("div", "failure");
  root.append(head, frame, figures, failure);
  $("#tiles").append(root);
  tile = { root, img, frame, state, quality, figures, failure, toggle, shown: false };
  tiles.set(name, tile);
  return tile;
}

function fmt(value, digits = 1) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

function renderCameras(cameras, previewFps) {
  const names = new Set(cameras.map((c) => c.name));
  for (const [name, tile] of tiles) {
    if (!names.has(name)) { tile.root.remove(); tiles.delete(name); }
  }
  for (const cam of cameras) {
    const tile = tileFor(cam.name);
    const disabled = cam.state === "disabled";
    tile.root.classList.toggle("disabled", disabled);
    if (!tile.toggle.disabled) tile.toggle.checked = !disabled;
    if (disabled) {
      tile.state.textContent = "disabled";
      tile.state.className = "badge state disabled";
      tile.quality.textContent = "";
      tile.quality.className = "badge quality";
      tile.figures.textContent = `enabled: false in the configuration · ${cam.source}`;
      tile.failure.textContent = "";
      tile.frame.replaceChildren(document.createTextNode("disabled"));
      tile.shown = false;
      continue;
    }
    tile.state.textContent = cam.state;
    tile.state.className = "badge state " + cam.state;
    tile.quality.textContent = cam.quality;
    tile.quality.className = "badge quality " + cam.quality;
    tile.figures.textContent =
      `in ${fmt(cam.fps_in)} fps · analysed ${fmt(cam.fps_analysed)} fps · skipped ${cam.frames_skipped}` +
      ` · faces ${cam.faces} · last frame ${fmt(cam.last_frame_age_s)} s ago` +
      ` · latency ${fmt(cam.latency_ms, 0)} ms` +
      ` · reconnects/h ${cam.reconnects_1h}`;
    // Why the camera last failed (the server masks secrets): current while it is not streaming, history after.
    tile.failure.textContent = cam.last_failure ?
      `${cam.state === "streaming" ? "last failure" : "failing"} ${clock(cam.last_failure_ts)}: ${cam.last_failure}` : "";
    tile.failure.classList.toggle("current", Boolean(cam.last_failure) && cam.state !== "streaming");
    if (previewFps <= 0 && !tile.shown) tile.frame.textContent = "previews disabled (server.preview_fps: 0)";
  }
}

async function switchCamera(name, toggle) {
  toggle.disabled = true;
  const tile = tiles.get(name);
  try {
    const response = await fetch(`api/cameras/${encodeURIComponent(name)}/enabled`, {
      method: "POST", headers: { ...headers, "Content-Type": "application/json" },
      body: JSON.stringify({ enabled: toggle.checked }), cache: "no-store" });
    const body = await response.json();
    if (!response.ok) {
      toggle.checked = !toggle.checked;
      const errors = body.errors ? body.errors.map((e) => e.text).join("; ") : body.error;
      tile.failure.textContent = `switch refused: ${errors}`;
      tile.failure.classList.add("current");
    } else if (body.reload && body.reload.result !== "applied") {
      tile.failure.textContent = `saved, reload ${body.reload.result}: ${(body.reload.errors || []).join("; ")}`;
    }
  } finally {
    toggle.disabled = false;
    refresh();
  }
}

function clock(ts) {
  return ts === null || ts === undefined ? "" : new Date(ts * 1000).toLocaleTimeString();
}

function renderOutputs(sinks) {
  const body = $("#outputs tbody");
  body.replaceChildren(...sinks.map((s) => {
    const row = el("tr");
    row.dataset.output = s.output;
    const word = !s.alive ? "stopped" : s.healthy ? "ok" : "failing";
    const state = el("td");
    state.append(el("span", "badge " + (word === "ok" ? "ok" : "failing"), word));
    const error = s.last_error ? `${clock(s.last_error_ts)} ${s.last_error}` : "";
    const failed = s.messages_failed ? `${s.failed} events, ${s.messages_failed} messages` : String(s.failed);
    row.append(el("td", "", s.output), el("td", "target", s.target || ""), state, el("td", "", String(s.sent)),
               el("td", "", String(s.messages_sent)), el("td", "", String(s.dropped)), el("td", "", failed),
               el("td", "", clock(s.last_sent_ts)), el("td", "error", error));
    return row;
  }));
}

function renderVisitors(visitors) {
  const body = $("#visitors tbody");
  body.replaceChildren(...Object.entries(visitors).map(([camera, v]) => {
    const row = el("tr");
    row.dataset.camera = camera;
    const dwell = v.mean_dwell_s === null ? "–" : `${fmt(v.mean_dwell_s, 1)} s`;
    const looked = v.looked_at_share === null ? "–" : `${fmt(100 * v.looked_at_share, 0)} %`;
    row.append(el("td", "", camera), el("td", "", String(v.visitors_last_hour)), el("td", "", dwell),
               el("td", "", looked));
    return row;
  }));
}

function renderCommands(commands) {
  const body = $("#commands tbody");
  body.replaceChildren(...commands.map((c) => {
    const row = el("tr");
    const when = new Date(c.ts * 1000).toLocaleTimeString();
    const expression = c.expression ? `${c.expression.preset} ${c.expression.weight}` : "";
    const tone = c.tone ? `${c.tone.style} (pitch ${c.tone.pitch}, rate ${c.tone.rate})` : "";
    for (const text of [when, c.camera, c.target ?? "room", `${c.emotion} ${fmt(c.confidence, 2)}`, expression, tone]) {
      row.append(el("td", "", String(text)));
    }
    return row;
  }));
}

async function refresh() {
  try {
    const response = await fetch("api/status", { headers, cache: "no-store" });
    if (response.status === 401) { // no token, or one the daemon no longer accepts: back to the token page
      sessionStorage.removeItem(TOKEN_KEY);
      location.reload();
      return;
    }
    if (!response.ok) throw new Error("HTTP " + response.status);
    const status = await response.json();
    const overall = $("#overall");
    overall.textContent = status.status;
    overall.className = "badge " + status.status;
    const ws = status.websocket.enabled ? ` · ws clients ${status.websocket.clients}` : "";
    const memory = (status.processes || []).filter((p) => p.rss_mb !== null)
      .map((p) => `${p.name} ${fmt(p.rss_mb / 1024, 2)} GiB`).join(", ");
    $("#summary").textContent = `up ${fmt(status.uptime_s / 60, 1)} min · ${status.cameras.length} camera(s)${ws}` +
      (memory ? ` · memory: ${memory}` : "");
    $("#problems").replaceChildren(...status.problems.map((p) => el("li", "", p)));
    renderCameras(status.cameras, status.preview_fps);
    renderOutputs(status.sinks);
    renderCommands(status.recent_commands);
    renderVisitors(status.visitors || {});
    renderReload(status.config);
    renderAvatars(status.avatars || []);
    refreshHistory();
    refreshLog();
  } catch (error) {
    $("#overall").textContent = "unreachable";
    $("#overall").className = "badge failing";
    $("#problems").replaceChildren(el("li", "", String(error.message || error)));
  }
}

function showPreview(name, jpeg) {
  const tile = tiles.get(name);
  if (!tile) return;
  const url = URL.createObjectURL(new Blob([jpeg], { type: "image/jpeg" }));
  const old = tile.img.src;
  tile.img.onload = () => { if (old.startsWith("blob:")) URL.revokeObjectURL(old); };
  tile.img.src = url;
  if (!tile.shown) { tile.frame.replaceChildren(tile.img); tile.shown = true; }
}

function connectPreviews() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const base = location.pathname.replace(/[^/]*$/, "");
  const protocols = token ? [PREVIEW_PROTOCOL, tokenProtocol(token)] : [];
  const socket = new WebSocket(`${scheme}//${location.host}${base}preview/ws`, protocols);
  socket.binaryType = "arraybuffer";
  socket.onmessage = (event) => {
    const bytes = new Uint8Array(event.data);
    const split = bytes.indexOf(10);
    if (split < 0) return;
    showPreview(new TextDecoder().decode(bytes.subarray(0, split)), bytes.subarray(split + 1));
  };
  socket.onclose = () => setTimeout(connectPreviews, 2000);
}

// --- history and log: what happened, filterable, and the daemon's newest warnings ---

function describeEvent(e) {
  if (e.type === "command") {
    const what = `${e.emotion} → ${e.expression.preset} ${fmt(e.expression.weight, 2)}, tone ${e.tone.style}`;
    return e.reason && e.reason !== "emotion" ? `${what} (${e.reason})` : what;
  }
  if (e.type === "camera") return e.detail ? `${e.state}: ${e.detail}` : e.state;
  if (e.type === "config") return e.status + (e.errors && e.errors.length ? `: ${e.errors.join("; ")}` : "");
  return "";
}

async function refreshHistory() {
  const types = [...document.querySelectorAll(".history-type:checked")].map((box) => box.value).join(",");
  const query = new URLSearchParams({ types: types || "none", q: $("#history-filter").value, limit: "100" });
  const response = await fetch(`api/history?${query}`, { headers, cache: "no-store" });
  if (!response.ok) return;
  const { events } = await response.json();
  $("#history tbody").replaceChildren(...events.map((e) => {
    const row = el("tr");
    row.dataset.type = e.type;
    for (const text of [clock(e.ts), e.type, e.avatar || e.camera || "", describeEvent(e)]) {
      row.append(el("td", "", String(text)));
    }
    return row;
  }));
}

async function refreshLog() {
  const response = await fetch("api/logs?limit=50", { headers, cache: "no-store" });
  if (!response.ok) return;
  const { lines } = await response.json();
  $("#log tbody").replaceChildren(...lines.map((line) => {
    const row = el("tr");
    row.append(el("td", "", clock(line.ts)), el("td", "level-" + line.level, line.level),
               el("td", "", `${line.logger}: ${line.message}`));
    return row;
  }));
}

for (const box of document.querySelectorAll(".history-type")) box.addEventListener("change", refreshHistory);
$("#history-filter").addEventListener("input", refreshHistory);

// --- avatars: what each stream was last told, what its VMC streams send now, and a test expression ---

const EMOTIONS = ["happy", "sad", "angry", "surprise", "fear", "disgust", "neutral"];
const avatarCards = new Map(); // stream name -> {root, state, weights, outcome}

function avatarCard(stream) {
  let card = avatarCards.get(stream.name);
  if (card) return card;
  const root = el("article", "avatar");
  root.dataset.stream = stream.name;
  const state = el("div", "state");
  const weights = el("div", "weights");
  const pick = el("select");
  pick.append(...EMOTIONS.map((name) => { const o = el("option", "", name); o.value = name; return o; }));
  const send = el("button", "send-trial", "Send test expression");
  send.type = "button";
  const outcome = el("span", "muted outcome");
  send.addEventListener("click", () => sendTrial(stream.name, pick.value, outcome));
  const trial = el("div", "trial");
  trial.append(pick, send, outcome);
  root.append(el("span", "name", `${stream.name} (${stream.kind})`), state, weights, trial);
  $("#avatars").append(root);
  card = { root, state, weights, outcome };
  avatarCards.set(stream.name, card);
  return card;
}

function renderAvatars(streams) {
  const names = new Set(streams.map((s) => s.name));
  for (const [name, card] of avatarCards) {
    if (!names.has(name)) { card.root.remove(); avatarCards.delete(name); }
  }
  for (const stream of streams) {
    const card = avatarCard(stream);
    const c = stream.current;
    card.state.textContent = c
      ? `${c.emotion}: ${c.expression.preset} ${fmt(c.expression.weight, 2)} · tone ${c.tone.style} ` +
        `(pitch ${c.tone.pitch}, rate ${c.tone.rate}) · since ${clock(c.ts)}`
      : "no command yet";
    const rows = [];
    for (const [output, weights] of Object.entries(stream.streamed)) {
      rows.push(el("div", "muted", `${output} streams:`));
      const entries = Object.entries(weights);
      if (!entries.length) rows.push(el("div", "muted", "all expressions at 0"));
      for (const [name, value] of entries) {
        const row = el("div", "weight");
        const bar = el("div", "bar");
        bar.style.width = `${Math.round(value * 160)}px`;
        row.append(el("span", "label", name), bar, el("span", "", fmt(value, 2)));
        rows.push(row);
      }
    }
    card.weights.replaceChildren(...rows);
  }
}

async function sendTrial(stream, expression, outcome) {
  outcome.textContent = "sending…";
  const response = await fetch(`api/streams/${encodeURIComponent(stream)}/test`, {
    method: "POST", headers: { ...headers, "Content-Type": "application/json" },
    body: JSON.stringify({ expression }), cache: "no-store" });
  const body = await response.json();
  outcome.textContent = response.ok
    ? `sent ${body.sent.expression.preset} ${fmt(body.sent.expression.weight, 2)}; neutral again in 3 s`
    : body.error;
  refresh();
}

// --- the configuration: the last reload's outcome, and the file in an editor checked by the daemon's own loader ---

function renderReload(config) {
  const box = $("#reload");
  const last = config.last_reload;
  $("#config-path").textContent = config.path || "";
  if (!last) { box.hidden = true; return; }
  box.hidden = false;
  box.className = "reload " + last.result;
  const when = clock(last.at);
  const head = last.result === "applied"
    ? `Configuration applied at ${when} (${last.trigger}): ${last.changes.join("; ") || "no change"}`
    : `Configuration rejected at ${when} (${last.trigger}); the running configuration stays in force:`;
  const list = el("ul");
  list.append(...last.errors.map((text) => el("li", "", text)));
  box.replaceChildren(el("span", "", head), list);
}

const editor = $("#config-text");
let badLines = new Set();

function drawLineNumbers() {
  const count = editor.value.split("\n").length;
  const numbers = [];
  for (let line = 1; line <= count; line += 1) {
    const span = el("span", badLines.has(line) ? "bad" : "", String(line));
    numbers.push(span, document.createTextNode("\n"));
  }
  $("#config-lines").replaceChildren(...numbers);
  editor.rows = count + 1; // as tall as the text: the numbers and the text scroll together in .editor
}

function goToLine(line) {
  const lines = editor.value.split("\n");
  const start = lines.slice(0, line - 1).reduce((total, text) => total + text.length + 1, 0);
  editor.focus();
  editor.setSelectionRange(start, start + (lines[line - 1] || "").length);
  $(".editor").scrollTop = Math.max(0, (line - 5) * 18.2);
}

function showErrors(errors) {
  badLines = new Set(errors.filter((e) => e.line).map((e) => e.line));
  $("#config-errors").replaceChildren(...errors.map((e) => {
    const item = el("li", "", e.text);
    if (e.line) item.addEventListener("click", () => goToLine(e.line));
    return item;
  }));
  drawLineNumbers();
}

async function loadConfig() {
  const response = await fetch("api/config", { headers, cache: "no-store" });
  if (!response.ok) { $("#config-mode").textContent = `cannot read the configuration (HTTP ${response.status})`; return; }
  editor.value = await response.text();
  const writable = response.headers.get("X-Config-Writable") === "true";
  editor.readOnly = !writable;
  $("#config-save").disabled = !writable;
  $("#config-mode").textContent = writable
    ? "Check runs the daemon's own loader; Save writes the file (the previous one is kept as .bak) and applies it."
    : `Read-only: ${response.headers.get("X-Config-Read-Only-Reason") || "saving is off on this daemon"}.`;
  showErrors([]);
  $("#config-outcome").textContent = "";
}

async function sendConfig(method, path) {
  const response = await fetch(path, { method, headers: { ...headers, "Content-Type": "application/yaml" },
                                       body: editor.value, cache: "no-store" });
  return { status: response.status, body: await response.json() };
}

$("#config-check").addEventListener("click", async () => {
  const { body } = await sendConfig("POST", "api/config/check");
  showErrors(body.errors || []);
  $("#config-outcome").textContent = body.errors && body.errors.length
    ? `${body.errors.length} problem(s); nothing saved` : "no problems found";
});

$("#config-save").addEventListener("click", async () => {
  $("#config-outcome").textContent = "saving…";
  const { status, body } = await sendConfig("PUT", "api/config");
  if (status === 422) {
    showErrors(body.errors);
    $("#config-outcome").textContent = `${body.errors.length} problem(s); nothing saved`;
    return;
  }
  if (status !== 200 && status !== 202) { $("#config-outcome").textContent = body.error || `HTTP ${status}`; return; }
  showErrors((body.reload.errors || []).map((text) => ({ text, line: null })));
  $("#config-outcome").textContent = `saved; reload ${body.reload.result}`;
  refresh();
});

$("#config-revert").addEventListener("click", loadConfig);
editor.addEventListener("input", drawLineNumbers);
$("#config-details").addEventListener("toggle", (event) => { if (event.target.open) loadConfig(); });

refresh();
setInterval(refresh, 1000);
connectPreviews();
