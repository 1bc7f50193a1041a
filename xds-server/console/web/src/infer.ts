// ModelInfer from the browser: connect-web's gRPC-Web transport to Envoy,
// which translates to gRPC for the backend pool.
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { GRPCInferenceService, ModelInferRequestSchema } from "./gen/grpc_service_pb";
import { decodeContents, decodeRaw, encodeRaw, parseShape, parseValues } from "./tensors";

export type InferForm = { url: string; model: string; input: string; datatype: string; shape: string; values: string; priority: string };
export type OutputTensor = { name: string; datatype: string; shape: number[]; values: (number | string | boolean)[] };
export type InferResult = {
  model: string; outputs: OutputTensor[]; ms: number;
  metadata: Record<string, string>;             // response headers and trailers
  parameters: Record<string, string>;           // the response's KServe parameters (priority_level, ...)
};

const clients = new Map<string, Client<typeof GRPCInferenceService>>();

function client(url: string): Client<typeof GRPCInferenceService> {
  if (!/^https?:\/\//.test(url)) throw new Error(`Envoy URL ${JSON.stringify(url)} must start with http:// or https://`);
  let c = clients.get(url);
  if (!c) {
    c = createClient(GRPCInferenceService, createGrpcWebTransport({ baseUrl: url, useBinaryFormat: true }));
    clients.set(url, c);
  }
  return c;
}

export async function modelInfer(f: InferForm, priorityHeader: string): Promise<InferResult> {
  const shape = parseShape(f.shape), values = parseValues(f.values);
  const want = shape.reduce((a, b) => a * b, 1n);
  if (BigInt(values.length) !== want) throw new Error(`shape [${f.shape}] needs ${want} values, got ${values.length}`);
  if (!f.model.trim()) throw new Error("model name is empty");
  const request = create(ModelInferRequestSchema, {
    modelName: f.model.trim(),
    inputs: [{ name: f.input.trim(), datatype: f.datatype, shape }],
    rawInputContents: [encodeRaw(f.datatype, values)],
  });
  const metadata: Record<string, string> = {};
  const keep = (h: Headers) => h.forEach((v, k) => { metadata[k] = v; });
  const started = performance.now();
  const res = await client(f.url).modelInfer(request, {
    headers: f.priority ? { [priorityHeader]: f.priority } : {},
    timeoutMs: 10000,
    onHeader: keep,
    onTrailer: keep,
  });
  const ms = performance.now() - started;
  const outputs = res.outputs.map((o, i) => ({
    name: o.name, datatype: o.datatype, shape: o.shape.map(Number),
    values: i < res.rawOutputContents.length ? decodeRaw(o.datatype, res.rawOutputContents[i])
      : o.contents ? decodeContents(o.contents) : [],
  }));
  const parameters: Record<string, string> = {};
  for (const [k, p] of Object.entries(res.parameters)) parameters[k] = String(p.parameterChoice.value);
  return { model: res.modelName, outputs, metadata, parameters, ms };
}

export async function modelMetadata(url: string, model: string) {
  return client(url).modelMetadata({ name: model.trim() }, { timeoutMs: 10000 });
}

// "NOT_FOUND: model 'x' is not loaded" -- the gRPC code name and the server's words.
export function describeError(e: unknown): string {
  if (e instanceof ConnectError) {
    const name = Code[e.code].replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
    return `${name}: ${e.rawMessage || "(no message)"}`;
  }
  return e instanceof Error ? e.message : String(e);
}
