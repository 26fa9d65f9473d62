// The five apps over the Switchboard gateway: JSON-RPC through POST /rpc/SERVICE, live
// state through one EventSource on /events. Plain browser JavaScript, no build step.
"use strict";

// The token comes once in the address (#token=...), as `switchboard up` prints it, and is
// kept for this tab only.
const tokenFromAddress = new URLSearchParams(location.hash.slice(1)).get("token");
if (tokenFromAddress) {
  sessionStorage.setItem("switchboard-token", tokenFromAddress);
  history.replaceState(null, "", location.pathname + location.search);
}
let token = sessionStorage.getItem("switchboard-token") || "";

const $ = (id) => document.getElementById(id);

/** An element with properties and children (text is always set as text, never as HTML). */
function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (name === "on") for (const [event, handler] of Object.entries(value)) node.addEventListener(event, handler);
    else if (name in node) node[name] = value;
    else node.setAttribute(name, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** A link target from data: http(s) (or the app's own wikipedia:// deep link) only, never
 *  a javascript: or data: address. */
const safeURL = (url) => (/^(https?|wikipedia):\/\//i.test(url || "") ? url : "#");

/** Shows MESSAGE in the box at the foot of the window; the page makes room for it below its
 * last section, so the box never covers what a person is reading (the route's price). A click
 * dismisses it. */
function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.classList.remove("hidden");
  document.body.style.paddingBottom = `${box.offsetHeight + 32}px`;
  clearTimeout(showError.timer);
  showError.timer = setTimeout(hideError, 6000);
}
function hideError() {
  $("error").classList.add("hidden");
  document.body.style.paddingBottom = "";
}
$("error").addEventListener("click", hideError);

let nextId = 1;
/** POSTs one JSON-RPC request for METHOD to SERVICE, accepting ACCEPT. */
async function post(service, method, params, accept) {
  const response = await fetch(`/rpc/${encodeURIComponent(service)}`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: accept, ...(token ? { Authorization: `Bearer ${token}` } : {}) },
    body: JSON.stringify({ jsonrpc: "2.0", id: nextId++, method, params }),
  });
  if (response.status === 401) askForToken();
  return response;
}

/** A JSON-RPC response's result, or its error thrown. */
function resultOf(service, method, answer) {
  if (answer.error) {
    const error = new Error(`${service} ${method}: ${answer.error.message}`);
    error.code = answer.error.code;
    error.data = answer.error.data;
    throw error;
  }
  return answer.result;
}

/** Calls METHOD on SERVICE; resolves to the result, rejects with the JSON-RPC error. */
async function call(service, method, params = {}) {
  const response = await post(service, method, params, "application/json");
  const answer = await response.json().catch(() => ({ error: { message: `HTTP ${response.status}` } }));
  return resultOf(service, method, answer);
}

/** Calls METHOD on SERVICE asking for its result in parts (a JSON line each): ON_PART gets
 *  each as it comes; resolves to the end (the result less its parts), rejects with the
 *  JSON-RPC error, which says how many parts came when the stream ended early. A method that
 *  answers in one reply gives no part and its whole result. */
async function stream(service, method, params, onPart) {
  const response = await post(service, method, params, "application/x-ndjson");
  if (!(response.headers.get("Content-Type") || "").startsWith("application/x-ndjson")) {
    const answer = await response.json().catch(() => ({ error: { message: `HTTP ${response.status}` } }));
    return resultOf(service, method, answer);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffered += value;
    for (let newline = buffered.indexOf("\n"); newline >= 0; newline = buffered.indexOf("\n")) {
      const line = JSON.parse(buffered.slice(0, newline));
      buffered = buffered.slice(newline + 1);
      if ("part" in line) onPart(line.part);
      else return resultOf(service, method, line);
    }
  }
  throw new Error(`${service} ${method}: the connection ended before the answer did`);
}

/** Runs an action, showing its failure instead of losing it. */
const guarded = (action) => async (event) => {
  if (event) event.preventDefault();
  try { await action(event); } catch (error) { showError(error.message); }
};

function askForToken() {
  $("token-needed").classList.remove("hidden");
}
$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  token = $("token-input").value.trim();
  sessionStorage.setItem("switchboard-token", token);
  location.reload();
});

// MARK: Live state: one stream for every view.

const state = new Map();           // key -> value, as the stream says
const watchers = [];               // [prefix, render]
const watch = (prefix, render) => watchers.push([prefix, render]);

function setStatus(text) {
  const status = $("status");
  status.textContent = text;
  status.className = `status ${text}`;
}

function changed(key) {
  for (const [prefix, render] of watchers) if (key.startsWith(prefix)) render();
}

function connect() {
  const query = new URLSearchParams();
  for (const prefix of ["/pricing/", "/store/"]) query.append("prefix", prefix);
  if (token) query.append("access_token", token);
  const stream = new EventSource(`/events?${query}`);
  let everSynced = false;
  const apply = (event) => {
    const { key, value } = JSON.parse(event.data);
    if (value === null) state.delete(key); else state.set(key, value);
    changed(key);
  };
  stream.addEventListener("snapshot", apply);
  stream.addEventListener("update", apply);
  stream.addEventListener("reset", () => {
    // What changed since our last event is not known: the snapshot that follows replaces all.
    const keys = [...state.keys()];
    state.clear();
    keys.forEach(changed);
  });
  stream.addEventListener("synced", () => {
    setStatus(everSynced ? "resynced" : "live");
    if (everSynced) setTimeout(() => $("status").textContent === "resynced" && setStatus("live"), 3000);
    everSynced = true;
  });
  stream.addEventListener("missed", () => setStatus("reconnecting"));
  stream.addEventListener("resynced", () => {
    setStatus("resynced");
    setTimeout(() => $("status").textContent === "resynced" && setStatus("live"), 3000);
  });
  // The browser reconnects by itself, sending Last-Event-ID: the gateway resumes from it.
  stream.onerror = () => setStatus("reconnecting");
}

// MARK: Countries

function dealLine(deal) {
  return [el("strong", {}, deal.title), " ", deal.message];
}

$("country-form").addEventListener("submit", guarded(async () => {
  const result = await call("search", "countries.search", { query: $("country-query").value });
  $("country-count").textContent = `${result.total} ${result.total === 1 ? "country" : "countries"}`;
  $("country-results").replaceChildren(...result.countries.map((country) =>
    el("li", {}, el("strong", {}, country.name), ` — capital ${country.capital || "none"}, ${country.regionName || country.region || ""}`,
       country.currency ? `, ${country.currency.name}` : "")));
}));
$("rollback").addEventListener("click", guarded(async () => {
  const deal = await call("pricing", "deals.rollback");
  $("rollback-deal").replaceChildren(...dealLine(deal));
}));
watch("/pricing/deal/today", () => {
  const deal = state.get("/pricing/deal/today");
  $("deal-today").replaceChildren(...(deal ? dealLine(deal) : []));
});

// MARK: Places

$("place-form").addEventListener("submit", guarded(async () => {
  const place = await call("search", "locations.resolve", { query: $("place-query").value });
  $("place-result").replaceChildren(el("p", {},
    el("strong", {}, place.label), ` at ${place.latitude}, ${place.longitude} `,
    el("a", { href: safeURL(place.webLink), target: "_blank", rel: "noopener" }, "Wikipedia Places"), " · ",
    el("a", { href: safeURL(place.deepLink) }, "in the app"),
    place.nearest ? ` · nearest known place: ${place.nearest.label} (${place.nearest.distanceKm} km)` : ""));
}));
$("history-clear").addEventListener("click", guarded(() => call("store", "history.clear")));
watch("/store/history", () => {
  const history = state.get("/store/history");
  $("history").replaceChildren(...(history ? history.entries : []).map((entry) =>
    el("li", {}, el("a", { href: "#places", on: { click: () => { $("place-query").value = entry.text; } } }, entry.text))));
});

// MARK: Hiring

// The list comes in parts (runs of one group's items) and is shown as they arrive.
$("items-load").addEventListener("click", guarded(async () => {
  const lists = new Map();
  let shown = 0;
  $("items").replaceChildren();
  $("items-summary").textContent = "Loading…";
  const end = await stream("search", "items.grouped", {}, (part) => {
    let list = lists.get(part.listId);
    if (!list) {
      list = el("ul", { className: "list" });
      lists.set(part.listId, list);
      $("items").append(el("details", {}, el("summary", {}, `List ${part.listId} (${part.count})`), list));
    }
    list.append(...part.items.map((item) => el("li", {}, item.name)));
    shown += part.items.length;
    $("items-summary").textContent = `${shown} items so far…`;
  });
  // A gateway or worker that answers in one reply: the groups come with the end.
  for (const group of end.groups) {
    $("items").append(el("details", {}, el("summary", {}, `List ${group.listId} (${group.count})`),
      el("ul", { className: "list" }, group.items.map((item) => el("li", {}, item.name)))));
    lists.set(group.listId, true);
  }
  $("items-summary").textContent = `${end.total} items in ${lists.size} lists (${end.dropped} without a name left out)`;
}));

// MARK: News

async function loadSources() {
  const result = await call("search", "sources.list");
  const selected = new Set(result.selected);
  $("sources").replaceChildren(...result.sources.map((source) =>
    el("label", {}, el("input", { type: "checkbox", value: source.id, checked: selected.has(source.id) }), ` ${source.name}`)));
}

/** Ticks the sources IDS, and only those. */
function showSources(ids) {
  const chosen = new Set(ids);
  for (const box of $("sources").querySelectorAll("input")) box.checked = chosen.has(box.value);
}

/** What the headlines' status says to a person (the service's own message names its methods). */
const headlineWords = {
  "no-sources-selected": "No news sources chosen yet: tick some above and press Save selection.",
  "no-results": "None of the chosen sources has headlines now: choose others above.",
};

async function loadHeadlines() {
  const result = await call("search", "headlines.list");
  $("headlines-status").textContent = headlineWords[result.status] || `${result.total} headlines`;
  $("headlines").replaceChildren(...result.articles.map((article) =>
    el("li", {}, el("a", { href: safeURL(article.url), target: "_blank", rel: "noopener" }, article.title), ` (${article.source.name}) `,
       el("button", { type: "button", on: { click: guarded(() => call("store", "articles.save", { article })) } }, "Save"))));
}

/** Says that a choice lost a race: someone else chose first, and what they chose is shown now. */
function lostRace(what, winner) {
  $("notice").textContent = `Someone else changed ${what} just before you: ${winner}. Their choice is shown; choose again to replace it.`;
  $("notice").classList.remove("hidden");
  clearTimeout(lostRace.timer);
  lostRace.timer = setTimeout(() => $("notice").classList.add("hidden"), 10000);
}

// Each choice is sent with the revision the page showed: one made meanwhile elsewhere is not
// overwritten in silence (the store answers -32004 with the winner).
$("sources-form").addEventListener("submit", guarded(async () => {
  const ids = [...$("sources").querySelectorAll("input:checked")].map((box) => box.value);
  const shown = state.get("/store/sources/selected");
  try {
    await call("store", "sources.select", { ids, revision: shown ? shown.revision || 0 : 0 });
  } catch (error) {
    if (error.code !== -32004 || !error.data || !error.data.current) throw error;
    const winner = error.data.current;
    // What won is the state now (its event may still be on its way): a second choice replaces it.
    if (!shown || (winner.revision || 0) > (shown.revision || 0)) state.set("/store/sources/selected", winner);
    showSources(winner.ids || []);
    lostRace("the news sources", (winner.ids || []).join(", ") || "none");
  }
}));
watch("/store/sources/selected", () => {
  const selection = state.get("/store/sources/selected");
  if (selection) showSources(selection.ids || []);
  guarded(loadHeadlines)();
});
watch("/store/articles/", () => {
  const saved = [...state.entries()].filter(([key]) => key.startsWith("/store/articles/")).map(([, value]) => value)
    .sort((a, b) => (b.savedAt || "").localeCompare(a.savedAt || ""));
  $("saved").replaceChildren(...saved.map((entry) => {
    const article = entry.article || entry;
    return el("li", {}, el("a", { href: safeURL(entry.url), target: "_blank", rel: "noopener" }, article.title || entry.url), " ",
              el("button", { type: "button", on: { click: guarded(() => call("store", "articles.delete", { url: entry.url })) } }, "Delete"));
  }));
});

// MARK: Flights

const money = (price) => (price ? `${price.amount} ${price.currency}` : "—");

async function loadFlights() {
  const [outbound, inbound] = await Promise.all([
    call("search", "flights.list", { direction: "outbound" }), call("search", "flights.list", { direction: "inbound" })]);
  const option = (flight) => el("option", { value: flight.id, "data-from": flight.departureAirportCode, "data-to": flight.arrivalAirportCode },
    `${flight.departureAirportCode}→${flight.arrivalAirportCode} ${flight.airline ? flight.airline.name : flight.airlineId} ${money(flight.price)}`);
  $("outbound-select").replaceChildren(...outbound.outbound.map(option));
  $("inbound-select").replaceChildren(el("option", { value: "" }, "(none)"), ...inbound.inbound.map(option));
  narrowInbound();
  showRoute();
}

/** Offers only the inbound flights that return from the chosen outbound (the service refuses
 * any other pair): the reverse leg, from where the outbound lands to where it took off. */
function narrowInbound() {
  const chosen = $("outbound-select").selectedOptions[0];
  const inbound = $("inbound-select");
  for (const option of inbound.options) {
    if (!option.value) continue;
    const returns = !!chosen && option.dataset.from === chosen.dataset.to && option.dataset.to === chosen.dataset.from;
    option.hidden = !returns;
    option.disabled = !returns;
  }
  if (inbound.selectedOptions[0] && inbound.selectedOptions[0].disabled) inbound.value = "";
}
$("outbound-select").addEventListener("change", narrowInbound);

$("route-form").addEventListener("submit", guarded(async () => {
  const inbound = $("inbound-select").value;
  const shown = state.get("/pricing/route/current");
  try {
    await call("pricing", "route.select", { outboundId: Number($("outbound-select").value), ...(inbound ? { inboundId: Number(inbound) } : {}),
                                            revision: shown ? shown.revision || 0 : 0 });
  } catch (error) {
    if (error.code !== -32004 || !error.data || !error.data.current) throw error;
    const winner = error.data.current;
    if (!shown || (winner.revision || 0) > (shown.revision || 0)) state.set("/pricing/route/current", { ...shown, ...winner });
    showRoute();
    const leg = (flight) => (flight ? `${flight.departureAirportCode}→${flight.arrivalAirportCode}` : "none");
    lostRace("the route", `out ${leg(winner.outbound)}, back ${leg(winner.inbound)} for ${money(winner.total)}`);
  }
}));

function showRoute() {
  const route = state.get("/pricing/route/current");
  if (!route) return;
  const leg = (flight) => (flight ? `${flight.departureAirportCode}→${flight.arrivalAirportCode} (${flight.airline}, ${money(flight.price)})` : "none");
  $("route-summary").textContent = `out ${leg(route.outbound)}, back ${leg(route.inbound)}`;
  $("route-price").textContent = money(route.total);
  // Which route the price is for, for scripts and tests.
  $("route").dataset.route = `${route.outboundId || ""}/${route.inboundId || ""}`;
  $("route-status").textContent = route.message || route.status || "";
  if (route.outboundId) $("outbound-select").value = route.outboundId;
  narrowInbound();
  $("inbound-select").value = route.inboundId || "";
}
watch("/pricing/route/current", showRoute);

// MARK: Start

connect();
for (const load of [loadSources, loadFlights]) guarded(load)();
