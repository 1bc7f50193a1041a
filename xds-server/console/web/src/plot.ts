// A small canvas line plot: p50 (solid) and p99 (dashed) per QoS class over time.
export type Point = { t: number; p50: number | null; p99: number | null };
export type Series = Record<string, Point[]>; // QoS class -> points (t in seconds, values in ms)

const COLORS = ["#c62828", "#2f5bd3", "#1a7f37", "#8a6d00", "#6a1b9a"];

export function drawLatency(canvas: HTMLCanvasElement, series: Series, classes: string[]): void {
  const ctx = canvas.getContext("2d");
  if (!ctx) return;
  // Draw at the size it is shown (CSS pixels x device ratio), so text is not stretched.
  const dpr = window.devicePixelRatio || 1;
  const W = canvas.clientWidth || canvas.width, H = canvas.clientHeight || canvas.height;
  if (canvas.width !== Math.round(W * dpr) || canvas.height !== Math.round(H * dpr)) {
    canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
  }
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  const L = 56, R = 190, T = 10, B = 28;
  ctx.clearRect(0, 0, W, H);
  ctx.font = "12px system-ui, sans-serif";
  const pts = classes.flatMap((c) => series[c] || []);
  canvas.dataset.points = String(pts.filter((p) => p.p50 !== null).length); // what was drawn, for tests
  const ts = pts.map((p) => p.t);
  const vs = pts.flatMap((p) => [p.p50, p.p99]).filter((v): v is number => v !== null);
  const t1 = ts.length ? Math.max(...ts) : 0, t0 = Math.min(t1 - 60, ...ts);
  const vmax = niceCeil(vs.length ? Math.max(...vs) : 1);
  const x = (t: number) => L + ((t - t0) / Math.max(t1 - t0, 1)) * (W - L - R);
  const y = (v: number) => H - B - (v / vmax) * (H - T - B);

  // Axes and grid, in ms and seconds-ago.
  ctx.strokeStyle = "#dfe3ea"; ctx.fillStyle = "#6b7385"; ctx.lineWidth = 1; ctx.setLineDash([]);
  for (let i = 0; i <= 4; i++) {
    const v = (vmax * i) / 4, yy = y(v);
    ctx.beginPath(); ctx.moveTo(L, yy); ctx.lineTo(W - R, yy); ctx.stroke();
    ctx.fillText(`${fmt(v)} ms`, 4, yy + 4);
  }
  for (let i = 0; i <= 4; i++) {
    const t = t0 + ((t1 - t0) * i) / 4;
    ctx.fillText(`-${Math.round(t1 - t)}s`, x(t) - 12, H - 8);
  }
  classes.forEach((c, i) => {
    const color = COLORS[i % COLORS.length], data = series[c] || [];
    for (const [key, dash] of [["p50", []], ["p99", [6, 4]]] as ["p50" | "p99", number[]][]) {
      ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.setLineDash(dash);
      ctx.beginPath();
      let pen = false;
      for (const p of data) {
        const v = p[key];
        if (v === null) { pen = false; continue; } // no requests in that window: a gap, not a zero
        if (pen) ctx.lineTo(x(p.t), y(v)); else ctx.moveTo(x(p.t), y(v));
        pen = true;
      }
      ctx.stroke();
    }
    ctx.fillStyle = color; // a dot per p50 point, so a lone point shows too
    for (const p of data) if (p.p50 !== null) { ctx.beginPath(); ctx.arc(x(p.t), y(p.p50), 2, 0, 2 * Math.PI); ctx.fill(); }
    const last = [...data].reverse().find((p) => p.p50 !== null);
    ctx.setLineDash([]); ctx.fillStyle = color;
    ctx.fillRect(W - R + 10, T + 6 + i * 18, 10, 10);
    ctx.fillText(`${c}${last ? ` ${fmt(last.p50!)}/${fmt(last.p99!)}` : ""}`, W - R + 24, T + 15 + i * 18);
  });
}

function niceCeil(v: number): number {
  if (v <= 0) return 1;
  const e = 10 ** Math.floor(Math.log10(v)), m = v / e;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * e;
}

function fmt(v: number): string {
  return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
}
