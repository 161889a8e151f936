"use strict";
const REFRESH_MS = 2000;

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function linkCell(text, href) {
  const td = document.createElement("td");
  const a = document.createElement("a");
  a.textContent = text;
  a.href = href;
  td.append(a);
  return td;
}

function fill(tableId, rows, emptyText, append = false) {
  const body = document.querySelector(`#${tableId} tbody`);
  if (!append) body.replaceChildren();
  if (rows.length === 0 && !append) {
    const tr = document.createElement("tr");
    const td = cell(emptyText, "empty");
    td.colSpan = document.querySelectorAll(`#${tableId} thead th`).length;
    tr.append(td);
    body.append(tr);
    return;
  }
  for (const row of rows) {
    const tr = document.createElement("tr");
    tr.dataset.name = row.key;
    tr.append(...row.cells);
    body.append(tr);
  }
}

const rate = (x) => (x >= 10 ? x.toFixed(0) : x.toFixed(1));
const seconds = (x) => (x >= 1 ? `${x.toFixed(1)} s` : x > 0 ? `${(x * 1000).toFixed(0)} ms` : "–");
const queueHref = (name) => `#queue=${encodeURIComponent(name)}`;

// -- charts (uPlot, vendored under static/) -----------------------------------------

const COLORS = ["#0969da", "#1a7f37", "#9a6700", "#cf222e", "#8250df"];
const charts = new Map();

function chart(container, key, title, labels, times, columns) {
  let entry = charts.get(key);
  if (!entry) {
    const box = document.createElement("div");
    box.className = "chart";
    box.dataset.chart = key;
    const heading = document.createElement("h3");
    heading.textContent = title;
    box.append(heading);
    container.append(box);
    const opts = {
      width: Math.max(380, Math.floor(container.clientWidth / 2) - 30), height: 160,
      series: [{}, ...labels.map((label, i) => ({ label, stroke: COLORS[i], width: 1.5 }))],
      scales: { y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
      legend: { live: false },
    };
    entry = { plot: new uPlot(opts, [times, ...columns], box), box };
    charts.set(key, entry);
  } else {
    entry.plot.setData([times, ...columns]);
  }
  entry.box.dataset.points = String(times.length);
  entry.box.dataset.last = columns.map((c) => c[c.length - 1] ?? "").join(",");
}

function dropCharts(prefix) {
  for (const [key, entry] of charts) {
    if (key.startsWith(prefix)) { entry.plot.destroy(); entry.box.remove(); charts.delete(key); }
  }
}

// -- the overview --------------------------------------------------------------------

function renderOverview(data) {
  fill("queues", data.queues.map((q) => ({
    key: q.name,
    cells: [
      linkCell(q.name, queueHref(q.name)), cell(q.depth), cell(rate(q.push_rate)),
      cell(rate(q.deliver_rate)), cell(q.pending), cell(seconds(q.oldest_pending_seconds)),
      cell(q.consumers), cell(q.delayed), cell(q.dead_letters, q.dead_letters > 0 ? "warn" : ""),
      cell(q.paused ? "paused" : (q.mode ?? "–"), q.paused ? "warn" : ""),
      cell(q.ordering ? `${q.ordering}: ${q.ordered_keys_in_flight} in flight, ${q.ordered_waiting} waiting` : "–"),
    ],
  })), "no queues");
  document.getElementById("queue-count").textContent = `(${data.queues.length})`;
  fill("shards", data.shards.map((s) => ({
    key: s.label,
    cells: [cell(s.label), cell(s.online ? "online" : "offline", s.online ? "ok" : "bad"),
            cell(s.ping_ms == null ? "–" : `${s.ping_ms} ms`)],
  })), "no shards");
  fill("federation", data.federation.map((t) => ({
    key: t.target,
    cells: [cell(t.current_url || t.target), cell(t.state, t.up ? "ok" : "bad"), cell(t.outbox),
            cell(seconds(t.outbox_age_seconds)), cell(t.lag_messages),
            cell(seconds(t.lag_seconds)), cell(t.resumes)],
  })), "no federation targets");
}

function renderLinks(data) {
  const box = document.getElementById("link-charts");
  for (const [url, s] of Object.entries(data.links)) {
    chart(box, `link:${url}:outbox`, `${url}: outbox and lag (messages)`, ["outbox", "lag"],
          s.t, [s.outbox, s.lag_messages]);
    chart(box, `link:${url}:up`, `${url}: link up`, ["up"], s.t, [s.up]);
  }
}

// -- a queue's page ------------------------------------------------------------------

let current = null;          // the queue shown, or null for the overview
let messagesFrom = 0;

function secretHeaders() {
  const secret = document.getElementById("secret").value;
  return secret ? { Authorization: `Bearer ${secret}` } : {};
}

async function api(path, options = {}) {
  const response = await fetch(path, {
    cache: "no-store", ...options, headers: { ...secretHeaders(), ...(options.headers ?? {}) },
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error ?? `HTTP ${response.status}`);
  return body;
}

// The name goes as a query parameter (names may hold "/"); suffix may bring its own.
const queuePath = (suffix = "") => {
  const [path, query] = suffix.split("?");
  const name = `name=${encodeURIComponent(current)}`;
  return `api/queue${path}?${query ? `${name}&${query}` : name}`;
};

function renderQueue(info) {
  document.getElementById("q-name").textContent = info.name;
  document.getElementById("q-summary").textContent =
    `${info.count} stored · ${info.pending} pending · ${info.delayed} delayed · ` +
    `${info.dead_letters} dead letters · mode ${info.mode ?? "–"}`;
  const state = document.getElementById("q-state");
  state.textContent = info.paused ? "paused" : "running";
  state.className = info.paused ? "warn" : "ok";
  document.getElementById("q-rate").textContent = info.rate_limit
    ? `${info.rate_limit.limit} per ${info.rate_limit.per_seconds} s` : "none";
  const order = info.ordering_state;
  document.getElementById("q-ordering").textContent = info.ordering
    ? `by ${info.ordering}: ${order.keys_in_flight} keys in flight, ${order.waiting} waiting` +
      (order.oldest_waiting_age == null ? "" : `, oldest ${seconds(order.oldest_waiting_age)}`)
    : "none";
  const schema = document.getElementById("q-schema");
  schema.textContent = info.schema
    ? `version ${info.schema.version} of ${info.schema.versions} (${info.schema.compatibility})`
    : "none";
  schema.title = info.schema ? JSON.stringify(info.schema.document, null, 2) : "";
  const h = info.history;
  if (h) {
    const box = document.getElementById("queue-charts");
    chart(box, "queue:depth", "depth and pending", ["depth", "pending"], h.t, [h.depth, h.pending]);
    chart(box, "queue:rates", "pushed/s and delivered/s", ["pushed/s", "delivered/s"], h.t,
          [h.push_rate, h.deliver_rate]);
    chart(box, "queue:dead", "dead letters", ["dead letters"], h.t, [h.dead_letters]);
  }
}

async function loadLists() {
  try {
    const dead = await api(queuePath("/dead?limit=100"));
    document.getElementById("dead-count").textContent = `(${dead.messages.length}${dead.more ? "+" : ""})`;
    fill("dead", dead.messages.map((m) => {
      const requeue = document.createElement("button");
      requeue.textContent = "requeue";
      requeue.onclick = () => act("/dead/requeue", { ids: [m.id] });
      const buttonCell = document.createElement("td");
      buttonCell.append(requeue);
      return {
        key: String(m.id),
        cells: [cell(m.id), cell(m.headers["busmq-dead-reason"] ?? "–"),
                cell(m.headers["busmq-dead-error"] ?? ""), cell(m.headers["busmq-dead-deliveries"] ?? ""),
                cell(new Date(m.time).toLocaleTimeString()), cell(m.payload, "payload"), buttonCell],
      };
    }), "no dead letters");
    messagesFrom = 0;
    await loadMessages(false);
  } catch (error) {
    fill("dead", [], `needs an admin secret: ${error.message}`);
    fill("messages", [], `needs an admin secret: ${error.message}`);
  }
}

async function loadMessages(append) {
  const page = await api(queuePath(`/messages?from=${messagesFrom}&limit=50`));
  fill("messages", page.messages.map((m) => ({
    key: String(m.id),
    cells: [cell(m.id), cell(new Date(m.time).toLocaleTimeString()), cell(m.kind),
            cell(JSON.stringify(m.headers)), cell(m.payload, "payload")],
  })), "no stored messages", append);
  if (page.messages.length) messagesFrom = page.messages[page.messages.length - 1].id + 1;
  document.getElementById("messages-more").hidden = !page.more;
}

async function act(suffix, body) {
  const say = document.getElementById("action-status");
  try {
    const result = await api(queuePath(suffix), {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body ?? {}),
    });
    say.textContent = `done: ${JSON.stringify(result)}`;
    say.className = "status ok";
    renderQueue(await api(queuePath()));
    await loadLists();
  } catch (error) {
    say.textContent = `refused: ${error.message}`;
    say.className = "status bad";
  }
}

document.getElementById("q-pause").onclick = () => act("/pause");
document.getElementById("q-resume").onclick = () => act("/resume");
document.getElementById("q-rate-set").onclick = () => act("/rate-limit", {
  limit: Number(document.getElementById("q-rate-limit").value),
  per_seconds: Number(document.getElementById("q-rate-per").value || 1),
});
document.getElementById("q-rate-clear").onclick = () => act("/rate-limit", { limit: null });
document.getElementById("dead-requeue").onclick = () => act("/dead/requeue", {});
document.getElementById("dead-purge").onclick = () => {
  if (confirm(`Remove every dead letter of ${current}?`)) act("/dead/purge");
};
document.getElementById("messages-more").onclick = () => loadMessages(true);
const secretInput = document.getElementById("secret");
secretInput.value = sessionStorage.getItem("busmq-secret") ?? "";
secretInput.onchange = () => {
  sessionStorage.setItem("busmq-secret", secretInput.value);
  if (current) loadLists();
};

function route() {
  const match = location.hash.match(/^#queue=(.+)$/);
  current = match ? decodeURIComponent(match[1]) : null;
  document.getElementById("overview-view").hidden = current !== null;
  document.getElementById("queue-view").hidden = current === null;
  dropCharts("queue:");
  document.getElementById("action-status").textContent = "";
  if (current !== null) loadLists();
}
window.addEventListener("hashchange", route);

// -- refreshing ------------------------------------------------------------------------

async function refresh() {
  const status = document.getElementById("status");
  try {
    const data = await api("api/overview");
    if (current === null) {
      renderOverview(data);
      renderLinks(await api("api/links"));
    } else {
      renderQueue(await api(queuePath()));
    }
    const when = new Date(data.taken_at * 1000).toLocaleTimeString();
    status.textContent = data.error ? `read failed: ${data.error}` : `updated ${when}`;
    status.className = data.error ? "status bad" : "status";
    document.body.dataset.updates = String(Number(document.body.dataset.updates ?? 0) + 1);
  } catch (error) {
    status.textContent = `cannot reach the gateway: ${error.message}`;
    status.className = "status bad";
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}
route();
refresh();
