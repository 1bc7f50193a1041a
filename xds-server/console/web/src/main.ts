// The console page: mesh state from the console's JSON API (fed by the control
// plane's debug endpoints and the backend's /metrics), and ModelInfer over gRPC-Web.
import { describeError, modelInfer, modelMetadata, type InferForm } from "./infer";
import { drawLatency, type Series } from "./plot";

type Config = {
  grpcWebUrl: string; model: string; priorities: string[]; priorityHeader: string; pollMs: number;
  priorityClasses: Record<string, string>;   // X-LLM-Priority value -> the mesh's QoS class
  classes: string[]; levels: Record<string, string>;   // QoS classes; priority level -> class
};
// One row per proxy and xDS type, as /debug/syncz reports it: SYNCED, STALE, NACKED, NOT SENT.
type Proxy = { id: string; error?: string; types: { type: string; status: string; acked: string; sent: string; resources: number; error: string }[] };
type Route = { listener: string; routeConfig: string; virtualHost: string; domains: string[]; match: string; clusters: string[]; source?: string; at?: string };
type Cluster = { name: string; endpoints: { address: string; health: string; weight?: number }[] };
// The served generation and the last change set the control plane rejected whole.
type ConfigStatus = { configDir: string; generation: string; appliedAt: number; resources: number;
  rejected: { at: number; count: number; errors: string[] } | null };
type ModelLoad = { model: string; waiting: number; running: number; kvCacheUtilization: number | null;
  prefixCacheHitRate: number | null; tokensPerSecond: number | null };
type ControlPlane = { reachable: boolean; unreachableSince: number | null; lastOk: number | null; error: string | null };
type PickerEndpoint = { endpoint: string; ready: boolean; waiting: number | null; running: number | null;
  kvCacheUtilization: number | null; inFlight: number; picked: number; ageMs: number | null };
type Picker = { pool: string | null; decisions: number; refused: Record<string, number>; prefixHitRate: number | null;
  meanDecisionUs: number | null; configError: string | null; endpoints: PickerEndpoint[]; error?: string };
type LoopInput = { endpoint: string; kvCacheUtilization: number | null; queue: string; running: number | null;
  prefixHitRate: number | null; memoryFraction: number | null;
  memorySource: string | null; ageMs: number | null };
type DecisionLoop = { policy: string | null; cycles: number; failures: Record<string, number>; latestCycle: number | null;
  latestAt: number | null; inputs: LoopInput[]; inForce: string[]; decisions: { cycle: number; at: number; did: string }[];
  error?: string };
type Mesh = { sources: Record<string, { url: string; error: string | null }>; proxies: Proxy[]; routes: Route[]; clusters: Cluster[];
  config: ConfigStatus | null; inference: ModelLoad[] | null; controlPlane: ControlPlane; updatedAt: number | null;
  picker: Picker | null; decisionLoop: DecisionLoop | null; schedulingUpdatedAt: number | null };

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;

function el(tag: string, text = "", cls = ""): HTMLElement {
  const e = document.createElement(tag);
  e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

function table(head: string[], rows: (string | HTMLElement)[][], empty: string): HTMLElement {
  if (!rows.length) return el("div", empty, "muted");
  const t = el("table"), tr = el("tr");
  head.forEach((h) => tr.appendChild(el("th", h)));
  t.appendChild(tr);
  for (const r of rows) {
    const row = el("tr");
    r.forEach((c) => { const td = el("td"); typeof c === "string" ? (td.textContent = c) : td.appendChild(c); row.appendChild(td); });
    t.appendChild(row);
  }
  return t;
}

const clock = (t: number | null | undefined) => (t ? new Date(t * 1000).toLocaleTimeString([], { hour12: false }) : "never");
const pct = (v: number | null | undefined) => (v === null || v === undefined ? "—" : `${(v * 100).toFixed(1)} %`);
const MAX_ROWS = 500;   // a table shows this many matching rows; the filter narrows 1,000 services down

// Bad news first: a change set rejected whole (the proxies are all SYNCED with the last good one),
// and a control plane that stopped answering (what is shown is as of its last answer).
function renderBanner(m: Mesh): void {
  const b = $("banner");
  const parts: HTMLElement[] = [];
  if (!m.controlPlane.reachable) {
    parts.push(el("div", `Control plane unreachable since ${clock(m.controlPlane.unreachableSince)} — showing what it ` +
      `said at ${clock(m.controlPlane.lastOk)}. ${m.controlPlane.error ?? ""}`, "banner-line"));
  }
  const rej = m.config?.rejected;
  if (rej) {
    parts.push(el("div", `Config rejected at ${clock(rej.at)}: the change set in ${m.config?.configDir} has ` +
      `${rej.errors.length} error(s)${rej.count > 1 ? ` (${rej.count} change sets in a row)` : ""}; every proxy keeps ` +
      `${m.config?.generation || "nothing"}.`, "banner-line"));
    const list = el("ul");
    rej.errors.slice(0, 10).forEach((e) => list.appendChild(el("li", e)));
    if (rej.errors.length > 10) list.appendChild(el("li", `… and ${rej.errors.length - 10} more (mcpctl validate)`));
    parts.push(list);
  }
  b.replaceChildren(...parts);
  b.dataset.state = !m.controlPlane.reachable ? "unreachable" : rej ? "rejected" : "ok";
}

function filtered<T>(rows: T[], text: (r: T) => string): { rows: T[]; note: string } {
  const q = (($("filter") as HTMLInputElement).value || "").trim().toLowerCase();
  const hit = q ? rows.filter((r) => text(r).toLowerCase().includes(q)) : rows;
  const shown = hit.slice(0, MAX_ROWS);
  return { rows: shown, note: `${hit.length} of ${rows.length}${hit.length > shown.length ? `, first ${shown.length} shown` : ""}` };
}

let lastMesh: Mesh | null = null;

function renderMesh(m: Mesh): void {
  lastMesh = m;
  renderBanner(m);
  $("sources").textContent = Object.entries(m.sources)
    .map(([k, s]) => `${k}: ${s.url || "(not set)"}${s.url && s.error ? ` — ${s.error}` : ""}`).join("   ");
  const stamp = `updated ${clock(m.updatedAt)}${m.controlPlane.reachable ? "" : " (control plane unreachable)"}`;
  document.querySelectorAll<HTMLElement>(".updated").forEach((s) => { s.textContent = stamp; });
  const cfg = m.config;
  $("config").textContent = cfg ? `serving ${cfg.generation || "nothing yet"} (${cfg.resources} resources, applied ` +
    `${clock(cfg.appliedAt)}) from ${cfg.configDir}` : "";
  renderInference(m.inference);
  renderPicker(m.picker);
  renderLoop(m.decisionLoop);
  const sched = `updated ${clock(m.schedulingUpdatedAt)}`;
  document.querySelectorAll<HTMLElement>(".updated-scheduling").forEach((s) => { s.textContent = sched; });
  const state = (t: Proxy["types"][number]) =>
    t.status === "NACKED" ? el("span", `NACK: ${t.error}`, "nack")
      : t.status === "SYNCED" ? el("span", `ACK (${t.resources})`, "ack")
        : el("span", t.status === "STALE" ? "sent, not yet ACKed" : t.status, "muted");
  // The proxy's id once, on its first row: ids are long, types are few.
  const proxyRows = m.proxies.flatMap((p) => p.types.map((t, i) => [i ? "" : p.id, t.type, t.acked || "—", state(t)]));
  $("proxies").replaceChildren(table(["proxy", "type", "acked version", "state"], proxyRows, "no proxy connected"));
  renderTables(m);
}

// file:line relative to the watched directory, which the proxies panel names once
const inConfigDir = (m: Mesh, at: string) => {
  const dir = m.config?.configDir?.replace(/\/+$/, "");
  return dir && at.startsWith(`${dir}/`) ? at.slice(dir.length + 1) : at;
};

function renderTables(m: Mesh): void {
  const routes = filtered(m.routes, (r) => `${r.listener} ${r.routeConfig} ${r.virtualHost} ${r.domains.join(" ")} ${r.match} ${r.clusters.join(" ")} ${r.source ?? ""} ${r.at ?? ""}`);
  $("routes").replaceChildren(table(["listener / route config", "virtual host", "match", "→ clusters", "from"],
    routes.rows.map((r) => [`${r.listener} / ${r.routeConfig}`, `${r.virtualHost} (${r.domains.join(", ")})`, r.match,
      r.clusters.join(", "), r.source ? `${r.source}${r.at ? ` (${inConfigDir(m, r.at)})` : ""}` : "—"]), "no routes"));
  $("routes-count").textContent = routes.note;
  const clusters = filtered(m.clusters, (c) => `${c.name} ${c.endpoints.map((e) => e.address).join(" ")}`);
  $("endpoints").replaceChildren(table(["cluster", "endpoint", "health"],
    clusters.rows.flatMap((c) => c.endpoints.length
      ? c.endpoints.map((e) => [c.name, e.address, el("span", e.health, e.health === "HEALTHY" ? "healthy" : "unhealthy")])
      : [[c.name, "—", el("span", "no endpoints", "unhealthy")]]), "no clusters"));
  $("endpoints-count").textContent = clusters.note;
}

function renderInference(models: ModelLoad[] | null): void {
  $("inference").replaceChildren(models === null
    ? el("div", "no model server configured (mcpctl console --backend URL)", "muted")
    : table(["model", "waiting", "running", "KV cache", "prefix hits", "tokens/s"],
      models.map((x) => [x.model, String(x.waiting), String(x.running), pct(x.kvCacheUtilization),
        pct(x.prefixCacheHitRate), x.tokensPerSecond === null ? "—" : x.tokensPerSecond.toFixed(1)]), "no model served"));
}

// The Endpoint Picker: where it sent requests and what it refused (429: shed, 503: nothing ready).
function renderPicker(p: Picker | null | undefined): void {
  if (!p) {
    $("picker").replaceChildren(el("div", "no Endpoint Picker configured (mcpctl console --picker URL)", "muted"));
    return;
  }
  if (p.error) {
    $("picker").replaceChildren(el("div", `Endpoint Picker ${p.error}`, "unhealthy"));
    return;
  }
  const refused = Object.entries(p.refused).map(([code, n]) => `${n} × HTTP ${code}`).join(", ") || "none";
  const summary = el("div", `pool ${p.pool ?? "—"}: ${p.decisions} decisions (mean ${p.meanDecisionUs ?? "—"} µs), ` +
    `refused ${refused}, prefix hits ${pct(p.prefixHitRate)}`, "summary");
  summary.id = "picker-summary";
  const parts: HTMLElement[] = [summary];
  if (p.configError) parts.push(el("div", `pool config: ${p.configError}`, "unhealthy"));
  parts.push(table(["endpoint", "ready", "picked", "in flight", "waiting", "running", "KV cache", "load age"],
    p.endpoints.map((e) => [e.endpoint, e.ready ? el("span", "ready", "healthy") : el("span", "not ready", "unhealthy"),
      String(e.picked), String(e.inFlight), String(e.waiting ?? "—"), String(e.running ?? "—"), pct(e.kvCacheUtilization),
      e.ageMs === null ? "—" : `${e.ageMs} ms`]), "no endpoints in the pool"));
  $("picker").replaceChildren(...parts);
}

// The decision loop: what it decided lately (newest first) and the inputs of its latest cycle.
function renderLoop(d: DecisionLoop | null | undefined): void {
  if (!d) {
    $("loop").replaceChildren(el("div", "no decision loop configured (mcpctl console --decision-loop URL)", "muted"));
    return;
  }
  if (d.error) {
    $("loop").replaceChildren(el("div", `decision loop ${d.error}`, "unhealthy"));
    return;
  }
  const failures = Object.entries(d.failures).map(([k, n]) => `${k} ${n}`).join(", ") || "none";
  const parts: HTMLElement[] = [el("div", `policy ${d.policy ?? "—"}, ${d.cycles} cycles, failures ${failures}; ` +
    `in force: ${d.inForce.join("; ") || "nothing"}`, "summary")];
  parts.push(table(["cycle", "at", "decided"], d.decisions.map((x) => [String(x.cycle), clock(x.at), x.did]),
    "no decision yet"));
  parts.push(el("div", `inputs of cycle ${d.latestCycle ?? "—"} (${clock(d.latestAt)})`, "muted"));
  parts.push(table(["replica", "waiting by class", "running", "KV cache", "prefix hits", "memory", "read age"],
    d.inputs.map((r) => [r.endpoint, r.queue, String(r.running ?? "—"), pct(r.kvCacheUtilization), pct(r.prefixHitRate),
      `${pct(r.memoryFraction)}${r.memorySource ? ` (${r.memorySource})` : ""}`, r.ageMs === null ? "—" : `${Math.round(r.ageMs)} ms`]),
    "no replica read"));
  $("loop").replaceChildren(...parts);
}

async function getJSON<T>(path: string): Promise<T> {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json() as Promise<T>;
}

function formValues(): InferForm {
  const v = (id: string) => ($(id) as HTMLInputElement).value;
  return { url: v("grpc-web-url"), model: v("model"), input: v("input-name"), datatype: v("datatype"),
    shape: v("shape"), values: v("values"), priority: v("priority") };
}

async function onInfer(cfg: Config, ev: Event): Promise<void> {
  ev.preventDefault();
  const err = $("infer-error"), out = $("infer-result");
  err.textContent = ""; out.textContent = "calling…"; out.removeAttribute("data-outputs");
  try {
    const res = await modelInfer(formValues(), cfg.priorityHeader);
    const level = res.parameters["priority_level"];
    const short = (v: number | string | boolean) => (typeof v === "number" ? Number(v.toPrecision(7)) : v);
    out.textContent = [`model ${res.model} answered in ${res.ms.toFixed(1)} ms` +
      (level ? `, queued as ${cfg.levels[level] ?? "?"} (priority level ${level})` : ""),
      ...res.outputs.map((o) => `${o.name} ${o.datatype} [${o.shape.join(",")}] = ${o.values.map(short).join(", ")}`),
      ...Object.entries(res.metadata).filter(([k]) => k.startsWith("x-mcp-")).map(([k, v]) => `${k}: ${v}`)].join("\n");
    out.dataset.outputs = JSON.stringify(res.outputs); // read back by the browser test
    out.dataset.state = "ok";
  } catch (e) {
    out.textContent = "";
    out.dataset.state = "error";
    err.textContent = `ModelInfer failed — ${describeError(e)}`;
  }
}

async function onMetadata(): Promise<void> {
  const f = formValues(), err = $("infer-error");
  err.textContent = "";
  try {
    const md = await modelMetadata(f.url, f.model);
    const inp = md.inputs[0];
    if (inp) {
      ($("input-name") as HTMLInputElement).value = inp.name;
      ($("datatype") as HTMLSelectElement).value = inp.datatype;
      ($("shape") as HTMLInputElement).value = inp.shape.map((d) => (d < 0n ? 1n : d)).join(",");
    }
    $("infer-result").textContent = `${md.name} (${md.platform}) inputs: ${md.inputs.map((i) => `${i.name} ${i.datatype} [${i.shape.join(",")}]`).join("; ")}`;
  } catch (e) {
    err.textContent = `ModelMetadata failed — ${describeError(e)}`;
  }
}

async function main(): Promise<void> {
  const cfg = await getJSON<Config>("/api/config");
  ($("grpc-web-url") as HTMLInputElement).value = cfg.grpcWebUrl;
  ($("model") as HTMLInputElement).value = cfg.model;
  const sel = $("priority") as HTMLSelectElement;
  // Named as the mesh's classes; the value is what the header carries.
  cfg.priorities.forEach((p) => sel.appendChild(Object.assign(document.createElement("option"),
    { value: p, textContent: `${cfg.priorityClasses[p] ?? p} (${p})` })));
  $("infer-form").addEventListener("submit", (ev) => void onInfer(cfg, ev));
  $("metadata-button").addEventListener("click", () => void onMetadata());
  $("filter").addEventListener("input", () => { if (lastMesh) renderTables(lastMesh); });
  // the form takes the model's input name, datatype and shape from its metadata
  if (cfg.model) void onMetadata();

  const poll = async () => {
    try { renderMesh(await getJSON<Mesh>("/api/mesh")); } catch (e) { $("sources").textContent = describeError(e); }
    try {
      const lat = await getJSON<{ series: Series; note: string }>("/api/latency");
      drawLatency($("latency-plot") as HTMLCanvasElement, lat.series, cfg.classes);
      $("latency-note").textContent = lat.note;
      document.querySelector<HTMLElement>(".updated-latency")!.textContent = `updated ${clock(Date.now() / 1000)}`;
    } catch (e) { $("latency-note").textContent = describeError(e); }
    document.body.dataset.polled = String(Number(document.body.dataset.polled || 0) + 1);
  };
  // The next poll starts pollMs after this one ended: a slow answer (a large mesh) never piles up requests.
  const loop = async (): Promise<void> => { await poll(); setTimeout(() => void loop(), cfg.pollMs); };
  await loop();
}

main().catch((e) => { document.body.prepend(el("div", `console failed to start: ${describeError(e)}`, "warn")); });
