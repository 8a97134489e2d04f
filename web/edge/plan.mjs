// Fetching an execution plan and its artifacts from the server, each artifact checked by size and sha256.
//
// GET {baseUrl}/v1/edge/plans/{class}, then GET .../artifacts/{file} per distinct file. The plan is read as the
// server wrote it (./json_text.mjs keeps which numbers were written as floats) and checked before anything is
// fetched: against the plan's JSON Schema, the very file the server checks plans with
// (vllm_omni/edge/plan/schemas/exec_plan.schema.json, served beside this module as ./schemas/), then each stateful
// step contract (./stateful_decoder.mjs). tests/data/plan_cases.json holds the documents the server's reader and
// this module must both accept or refuse (a refusal naming the same field); the words are each reader's own. A
// body is read with a cap at the plan's size_bytes (a longer or endless body is refused there), then hashed with
// WebCrypto; nothing unchecked is kept. Verified files go into a Cache-Storage-like cache (`match`/`put`) keyed by
// plan_id and file. A file found there is hashed again before it is used: Cache Storage has no file identity to
// remember a verification by (anything running in the origin can rewrite an entry), so what the cache saves is
// the download, not the check; a damaged entry is fetched anew.

import planSchema from "./schemas/exec_plan.schema.json" with { type: "json" };

import { firstSchemaError } from "./json_schema.mjs";
import { jsonType, readJson, shown } from "./json_text.mjs";
import { serverMessage } from "./server_message.mjs";
import { checkStepContract } from "./stateful_decoder.mjs";
import { MalformedMessageError } from "./stream.mjs";

/** A plan this page will not use. `field`: the path of the field at fault ("" for the whole plan), when there is
 * one; `status`: the HTTP status of a refused request. */
export class PlanError extends Error {
  constructor(message, { status, field } = {}) {
    super(message);
    this.name = "PlanError";
    this.status = status;
    this.field = field;
  }
}

export const PLAN_SCHEMA = planSchema.properties.schema.const;
export const PLAN_SCHEMA_VERSION = planSchema.properties.schema_version.const;

function hex(buffer) {
  return Array.from(new Uint8Array(buffer), (byte) => byte.toString(16).padStart(2, "0")).join("");
}

async function refusal(response, what) {
  const message = await serverMessage(response);
  if (response.status === 401) {
    return new PlanError(`the server refused the API key (401) while fetching ${what}: ${message}`, { status: 401 });
  }
  return new PlanError(`${what}: HTTP ${response.status}: ${message}`, { status: response.status });
}

/**
 * Check `plan` against the plan's JSON Schema as the server's reader does (vllm_omni/edge/plan/schema.py: schema id
 * and version first, then the schema, then each graph's external data file named as the graph records it, beside
 * it); returns the plan. A refusal is a PlanError naming the field at fault.
 */
export function checkPlanSchema(plan, source = "plan") {
  const refuse = (field, message) => new PlanError(`${source}: ${field || "the plan"}: ${message}`, { field });
  if (plan === null || typeof plan !== "object" || Array.isArray(plan)) {
    throw refuse("", `a plan is a JSON object, found ${jsonType(plan)}`);
  }
  if (plan.schema !== PLAN_SCHEMA) {
    throw refuse("schema", `expected ${shown(PLAN_SCHEMA)}, found ${shown(plan.schema)}: not an execution plan`);
  }
  if (plan.schema_version !== PLAN_SCHEMA_VERSION) {
    throw refuse(
      "schema_version",
      `this page reads plan schema ${PLAN_SCHEMA_VERSION}, found ${shown(plan.schema_version)}: rebuild the ` +
        "plan with this version of vllm-omni-edge, or load the page of the server's version",
    );
  }
  const error = firstSchemaError(planSchema, plan);
  if (error) throw refuse(error.field, error.message);
  for (const [role, artifact] of Object.entries(plan.artifacts)) {
    const weights = artifact.external_data;
    if (weights && weights.file !== `${artifact.file}.data`) {
      throw refuse(
        `artifacts.${role}.external_data.file`,
        `expected ${shown(`${artifact.file}.data`)} (beside the graph, under the name it records), found ` +
          shown(weights.file),
      );
    }
  }
  return plan;
}

/**
 * The plan's distinct files with their expected size and sha256 (a file named by two roles is one file; a graph's
 * external data file is one of them), after
 * checking the plan (checkPlanSchema) and, for a stateful plan, each role's step contract.
 */
export function planFiles(plan, source = "plan") {
  checkPlanSchema(plan, source);
  const files = new Map();
  for (const [role, artifact] of Object.entries(plan.artifacts)) {
    if (plan.graph_kind === "stateful") {
      try {
        checkStepContract(artifact.contract, `the step contract of artifact ${shown(role)}`);
      } catch (error) {
        const field = [`artifacts.${role}.contract`, error.field].filter(Boolean).join(".");
        throw new PlanError(`${source}: ${field}: ${error.message}`, { field });
      }
    }
    for (const record of [artifact, artifact.external_data].filter(Boolean)) {
      const { file, sha256, size_bytes: size } = record;
      const known = files.get(file);
      if (known && (known.sha256 !== sha256 || known.size !== size)) {
        throw new PlanError(`${source}: artifact ${file} is named twice with different sha256 or size`);
      }
      files.set(file, { file, sha256, size });
    }
  }
  return [...files.values()];
}

/**
 * Check that the stream whose start event is `start` (a CodecStreamParser event) was made for `plan`, as the Python
 * client does (vllm_omni/edge/client/session.py check_start): the plan it names (a PlanError: reload the plan), and
 * its codec geometry: codebooks, codebook size, sample rate and frame rate (within a relative 1e-6; the plan's is
 * sample_rate / samples_per_frame), a MalformedMessageError naming each field that differs.
 */
export function checkStreamStart(start, plan) {
  if (start.plan_id && start.plan_id !== plan.plan_id) {
    throw new PlanError(
      `the stream was made for plan ${start.plan_id.slice(0, 12)}, this page loaded plan ${plan.plan_id.slice(0, 12)} ` +
        `(${plan.hardware_class}): reload the plan`,
    );
  }
  const wrong = ["num_quantizers", "codebook_size", "sample_rate"]
    .filter((key) => start[key] !== plan[key])
    .map((key) => [key, start[key], plan[key]]);
  const frameRate = plan.sample_rate / plan.samples_per_frame;
  const apart = Math.abs(start.frame_rate - frameRate);
  if (!(apart <= 1e-6 * Math.max(Math.abs(start.frame_rate), Math.abs(frameRate)))) {
    wrong.push(["frame_rate", start.frame_rate, frameRate]);
  }
  if (wrong.length) {
    const details = wrong.map(([key, stream, planned]) => `${key}: stream ${stream}, plan ${planned}`).join("; ");
    throw new MalformedMessageError(`the stream's geometry does not match the plan (${details}): they do not belong together`);
  }
}

/** The URL path of `file` (a path relative to the plan, maybe in a subfolder): each segment escaped. */
export const artifactPath = (file) => file.split("/").map(encodeURIComponent).join("/");

/** The body of `response`, refused as soon as it passes `limit` bytes (no allocation from a hostile length). */
async function readCapped(response, limit, file) {
  if (!response.body || typeof response.body.getReader !== "function") {
    const buffer = await response.arrayBuffer();
    if (buffer.byteLength > limit) throw new PlanError(`artifact ${file}: expected ${limit} bytes, the body is longer`);
    return buffer;
  }
  const reader = response.body.getReader();
  const out = new Uint8Array(limit);
  let filled = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (filled + value.length > limit) {
      await reader.cancel();
      throw new PlanError(`artifact ${file}: expected ${limit} bytes, the body is longer; refused`);
    }
    out.set(value, filled);
    filled += value.length;
  }
  return filled === limit ? out.buffer : out.slice(0, filled).buffer;
}

/**
 * Fetch the plan of `hardwareClass` and every artifact it names; returns `{plan, artifacts: Map(file ->
 * ArrayBuffer), fetched: [files], cached: [files], damaged: [files], seconds}` (`damaged`: cached entries whose size
 * or sha256 no longer matched, fetched again). A plan that fails its checks throws PlanError before any artifact is
 * fetched; a wrong size or sha256 throws PlanError naming the file, the expected and the found value, and caches
 * nothing.
 */
export async function loadPlan({
  baseUrl = "",
  hardwareClass = "browser",
  apiKey = null,
  fetch = globalThis.fetch,
  cache = null,
  crypto = globalThis.crypto,
} = {}) {
  const started = performance.now();
  const headers = apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
  const base = `${baseUrl.replace(/\/$/, "")}/v1/edge/plans/${encodeURIComponent(hardwareClass)}`;
  let response;
  try {
    response = await fetch(base, { headers, cache: "no-store" });
  } catch (error) {
    throw new PlanError(`cannot reach the server for the ${hardwareClass} plan: ${error.message}`);
  }
  if (!response.ok) throw await refusal(response, `the ${hardwareClass} plan`);
  let plan;
  try {
    plan = readJson(await response.text());
  } catch (error) {
    throw new PlanError(`the ${hardwareClass} plan is not JSON: ${error.message}`);
  }
  const files = planFiles(plan, `the ${hardwareClass} plan`);
  const artifacts = new Map();
  const verified = [];
  const cached = [];
  const damaged = [];
  const cacheKey = (file) => `${base}/artifacts/${artifactPath(file)}?plan_id=${plan.plan_id}`;
  const sha256Of = async (buffer) => hex(await crypto.subtle.digest("SHA-256", buffer));
  for (const { file, sha256, size } of files) {
    const hit = cache ? await cache.match(cacheKey(file)) : undefined;
    if (hit) {
      const buffer = await hit.arrayBuffer();
      if (buffer.byteLength === size && (await sha256Of(buffer)) === sha256) {
        artifacts.set(file, buffer);
        cached.push(file);
        continue;
      }
      damaged.push(file); // fetched and verified anew below; the put replaces the entry
    }
    let body;
    try {
      body = await fetch(`${base}/artifacts/${artifactPath(file)}`, { headers, cache: "no-store" });
    } catch (error) {
      throw new PlanError(`cannot fetch artifact ${file}: ${error.message}`);
    }
    if (!body.ok) throw await refusal(body, `artifact ${file}`);
    const buffer = await readCapped(body, size, file);
    if (buffer.byteLength !== size) {
      throw new PlanError(`artifact ${file}: expected ${size} bytes, found ${buffer.byteLength}; nothing was cached`);
    }
    const found = await sha256Of(buffer);
    if (found !== sha256) {
      throw new PlanError(
        `artifact ${file}: sha256 mismatch: expected ${sha256}, found ${found}; the file is damaged or not the ` +
          "plan's, nothing was cached",
      );
    }
    artifacts.set(file, buffer);
    verified.push(file);
  }
  if (cache) {
    for (const file of verified) {
      // Response copies the bytes it is given (Fetch: "get a copy of the bytes held by the buffer source")
      const response = new Response(artifacts.get(file), {
        headers: { "Content-Type": "application/octet-stream", "X-Content-SHA256": files.find((f) => f.file === file).sha256 },
      });
      await cache.put(cacheKey(file), response);
    }
  }
  return { plan, artifacts, fetched: verified, cached, damaged, seconds: (performance.now() - started) / 1000 };
}
