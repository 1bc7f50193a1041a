// The console page: mesh state from the console's JSON API (fed by the control
// plane's debug endpoints and the backend's /metrics), and ModelInfer over gRPC-Web.
import { describeError, modelInfer, modelMetadata, type InferForm } from "./infer";
import { drawLatency, type Series } from "./plot";

type Config = {
  grpcWebUrl: string; model: string; priorities: string[]; priorityHeader: string; pollMs: number;
  classes: string[]; levels: Record<string, string>;   // QoS classes; priority level -> class
};
// One row per proxy and xDS type, as /debug/syncz reports it: SYNCED, STALE, NACKED, NOT SENT.
type Proxy = { id: string; error?: string; types: { type: string; status: string; acked: string; sent: string; resources: number; error: string }[] };
type Route = { listener: string; routeConfig: string; virtualHost: string; domains: string[]; match: string; clusters: string[] };
type Cluster = { name: string; endpoints: { address: string; health: string; weight?: number }[] };
type Mesh = { sources: Record<string, { url: string; error: string | null }>; proxies: Proxy[]; routes: Route[]; clusters: Cluster[] };

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

function renderMesh(m: Mesh): void {
  $("sources").textContent = Object.entries(m.sources)
    .map(([k, s]) => `${k}: ${s.url || "(not set)"}${s.error ? ` — ${s.error}` : ""}`).join("   ");
  const state = (t: Proxy["types"][number]) =>
    t.status === "NACKED" ? el("span", `NACK: ${t.error}`, "nack")
      : t.status === "SYNCED" ? el("span", `ACK (${t.resources})`, "ack")
        : el("span", t.status === "STALE" ? "sent, not yet ACKed" : t.status, "muted");
  // The proxy's id once, on its first row: ids are long, types are few.
  const proxyRows = m.proxies.flatMap((p) => p.types.map((t, i) => [i ? "" : p.id, t.type, t.acked || "—", state(t)]));
  $("proxies").replaceChildren(table(["proxy", "type", "acked version", "state"], proxyRows, "no proxy connected"));
  $("routes").replaceChildren(table(["listener / route config", "virtual host", "match", "→ clusters"],
    m.routes.map((r) => [`${r.listener} / ${r.routeConfig}`, `${r.virtualHost} (${r.domains.join(", ")})`, r.match, r.clusters.join(", ")]), "no routes"));
  $("endpoints").replaceChildren(table(["cluster", "endpoint", "health"],
    m.clusters.flatMap((c) => c.endpoints.length
      ? c.endpoints.map((e) => [c.name, e.address, el("span", e.health, e.health === "HEALTHY" ? "healthy" : "unhealthy")])
      : [[c.name, "—", el("span", "no endpoints", "unhealthy")]]), "no clusters"));
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
  cfg.priorities.forEach((p) => sel.appendChild(Object.assign(document.createElement("option"), { value: p, textContent: p })));
  $("infer-form").addEventListener("submit", (ev) => void onInfer(cfg, ev));
  $("metadata-button").addEventListener("click", () => void onMetadata());

  const poll = async () => {
    try { renderMesh(await getJSON<Mesh>("/api/mesh")); } catch (e) { $("sources").textContent = describeError(e); }
    try {
      const lat = await getJSON<{ series: Series; note: string }>("/api/latency");
      drawLatency($("latency-plot") as HTMLCanvasElement, lat.series, cfg.classes);
      $("latency-note").textContent = lat.note;
    } catch (e) { $("latency-note").textContent = describeError(e); }
    document.body.dataset.polled = String(Number(document.body.dataset.polled || 0) + 1);
  };
  await poll();
  setInterval(poll, cfg.pollMs);
}

main().catch((e) => { document.body.prepend(el("div", `console failed to start: ${describeError(e)}`, "warn")); });
