// KServe v2 tensors <-> plain numbers. Inputs go as raw_input_contents
// (little-endian, row-major), as Triton's clients send them; outputs are read
// from raw_output_contents or, when a server fills them, typed contents.
import type { InferTensorContents } from "./gen/grpc_service_pb";

type Codec = { size: number; read: (v: DataView, o: number) => number; write: (v: DataView, o: number, x: number) => void };

const CODECS: Record<string, Codec> = {
  FP64: { size: 8, read: (v, o) => v.getFloat64(o, true), write: (v, o, x) => v.setFloat64(o, x, true) },
  FP32: { size: 4, read: (v, o) => v.getFloat32(o, true), write: (v, o, x) => v.setFloat32(o, x, true) },
  FP16: { size: 2, read: (v, o) => halfToNumber(v.getUint16(o, true)), write: () => { throw new Error("FP16 inputs are not supported here"); } },
  INT64: { size: 8, read: (v, o) => Number(v.getBigInt64(o, true)), write: (v, o, x) => v.setBigInt64(o, BigInt(x), true) },
  INT32: { size: 4, read: (v, o) => v.getInt32(o, true), write: (v, o, x) => v.setInt32(o, x, true) },
  INT16: { size: 2, read: (v, o) => v.getInt16(o, true), write: (v, o, x) => v.setInt16(o, x, true) },
  INT8: { size: 1, read: (v, o) => v.getInt8(o), write: (v, o, x) => v.setInt8(o, x) },
  UINT64: { size: 8, read: (v, o) => Number(v.getBigUint64(o, true)), write: (v, o, x) => v.setBigUint64(o, BigInt(x), true) },
  UINT32: { size: 4, read: (v, o) => v.getUint32(o, true), write: (v, o, x) => v.setUint32(o, x, true) },
  UINT16: { size: 2, read: (v, o) => v.getUint16(o, true), write: (v, o, x) => v.setUint16(o, x, true) },
  UINT8: { size: 1, read: (v, o) => v.getUint8(o), write: (v, o, x) => v.setUint8(o, x) },
  BOOL: { size: 1, read: (v, o) => v.getUint8(o), write: (v, o, x) => v.setUint8(o, x ? 1 : 0) },
};

function halfToNumber(h: number): number {
  const sign = h & 0x8000 ? -1 : 1, exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
  if (exp === 0) return sign * 2 ** -14 * (frac / 1024);
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * 2 ** (exp - 15) * (1 + frac / 1024);
}

export function parseShape(text: string): bigint[] {
  const dims = text.split(",").map((s) => s.trim()).filter(Boolean);
  if (!dims.length) throw new Error("shape is empty: give dimensions like 1,4");
  return dims.map((d) => {
    if (!/^\d+$/.test(d)) throw new Error(`shape dimension ${JSON.stringify(d)} is not a non-negative integer`);
    return BigInt(d);
  });
}

export function parseValues(text: string): number[] {
  return text.split(/[\s,]+/).filter(Boolean).map((s) => {
    const x = Number(s);
    if (!Number.isFinite(x)) throw new Error(`value ${JSON.stringify(s)} is not a number`);
    return x;
  });
}

export function encodeRaw(datatype: string, values: number[]): Uint8Array {
  const c = CODECS[datatype];
  if (!c) throw new Error(`datatype ${datatype} is not supported by this page`);
  const buf = new ArrayBuffer(values.length * c.size), view = new DataView(buf);
  values.forEach((x, i) => c.write(view, i * c.size, x));
  return new Uint8Array(buf);
}

export function decodeRaw(datatype: string, raw: Uint8Array): (number | string)[] {
  if (datatype === "BYTES") {
    // Each element: a 4-byte little-endian length, then that many bytes.
    const out: string[] = [], view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
    for (let o = 0; o + 4 <= raw.length;) {
      const n = view.getUint32(o, true);
      out.push(new TextDecoder().decode(raw.subarray(o + 4, o + 4 + n)));
      o += 4 + n;
    }
    return out;
  }
  const c = CODECS[datatype];
  if (!c) throw new Error(`output datatype ${datatype} is not supported by this page`);
  if (raw.length % c.size) throw new Error(`${raw.length} raw bytes is not a whole number of ${datatype}`);
  const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength), out: number[] = [];
  for (let o = 0; o < raw.length; o += c.size) out.push(c.read(view, o));
  return out;
}

export function decodeContents(c: InferTensorContents): (number | string | boolean)[] {
  const lists: unknown[][] = [c.fp32Contents, c.fp64Contents, c.intContents, c.int64Contents,
    c.uintContents, c.uint64Contents, c.boolContents];
  for (const l of lists) if (l.length) return l.map((x) => (typeof x === "bigint" ? Number(x) : x)) as (number | boolean)[];
  if (c.bytesContents.length) return c.bytesContents.map((b) => new TextDecoder().decode(b));
  return [];
}
