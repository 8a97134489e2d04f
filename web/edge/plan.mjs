// Fetching an execution plan and its artifacts from the server, each artifact checked by size and sha256.
//
// GET {baseUrl}/v1/edge/plans/{class}, then GET .../artifacts/{file} per distinct file. A body is read
// with a cap at the plan's size_bytes (a longer or endless body is refused there), then hashed with
// WebCrypto; nothing unchecked is kept. Verified files go into a Cache-Storage-like cache (`match`/`put`)
// keyed by plan_id and file: the plan_id hashes every artifact's sha256, so a file found under it was
// verified when it was put and is not hashed again (as the Python device cache remembers by identity).

export class PlanError extends Error {
  constructor(message, { status } = {}) {
    super(message);
    this.name = "PlanError";
    this.status = status;
  }
}

const SHA256 = /^[0-9a-f]{64}$/;
const SAFE_FILE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$/;

function hex(buffer) {
  return Array.from(new Uint8Array(buffer), (byte) => byte.toString(16).padStart(2, "0")).join("");
}

async function serverMessage(response) {
  try {
    const body = await response.json();
    return body?.error?.message ?? body?.detail ?? JSON.stringify(body).slice(0, 200);
  } catch {
    return response.statusText || "no message";
  }
}

async function refusal(response, what) {
  const message = await serverMessage(response);
  if (response.status === 401) {
    return new PlanError(`the server refused the API key (401) while fetching ${what}: ${message}`, { status: 401 });
  }
  return new PlanError(`${what}: HTTP ${response.status}: ${message}`, { status: response.status });
}

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

/** The plan's distinct files with their expected size and sha256 (a file named by two roles is one file). */
export function planFiles(plan) {
  if (plan === null || typeof plan !== "object" || typeof plan.artifacts !== "object" || plan.artifacts === null) {
    throw new PlanError("the plan has no artifacts object: not an execution plan");
  }
  if (typeof plan.plan_id !== "string" || !SHA256.test(plan.plan_id)) {
    throw new PlanError(`the plan's plan_id ${String(plan.plan_id).slice(0, 80)} is not 64 hex digits`);
  }
  const files = new Map();
  for (const [role, artifact] of Object.entries(plan.artifacts)) {
    const { file, sha256, size_bytes: size } = artifact ?? {};
    if (typeof file !== "string" || !SAFE_FILE.test(file)) {
      throw new PlanError(`artifact ${role}: file ${JSON.stringify(file)?.slice(0, 80)} is not a plain file name`);
    }
    if (typeof sha256 !== "string" || !SHA256.test(sha256) || !Number.isSafeInteger(size) || size < 0) {
      throw new PlanError(`artifact ${role} (${file}): sha256 and size_bytes are missing or malformed`);
    }
    const known = files.get(file);
    if (known && (known.sha256 !== sha256 || known.size !== size)) {
      throw new PlanError(`artifact ${file} is named twice with different sha256 or size`);
    }
    files.set(file, { file, sha256, size });
  }
  return [...files.values()];
}

/**
 * Fetch the plan of `hardwareClass` and every artifact it names; returns `{plan, artifacts: Map(file ->
 * ArrayBuffer), fetched: [files], cached: [files], seconds}`. A wrong size or sha256 throws PlanError naming
 * the file, the expected and the found value, and caches nothing.
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
    plan = await response.json();
  } catch {
    throw new PlanError(`the ${hardwareClass} plan is not JSON`);
  }
  const files = planFiles(plan);
  const artifacts = new Map();
  const verified = [];
  const cached = [];
  const cacheKey = (file) => `${base}/artifacts/${encodeURIComponent(file)}?plan_id=${plan.plan_id}`;
  for (const { file, sha256, size } of files) {
    const hit = cache ? await cache.match(cacheKey(file)) : undefined;
    if (hit) {
      const buffer = await hit.arrayBuffer();
      if (buffer.byteLength === size) {
        artifacts.set(file, buffer);
        cached.push(file);
        continue;
      }
    }
    let body;
    try {
      body = await fetch(`${base}/artifacts/${encodeURIComponent(file)}`, { headers, cache: "no-store" });
    } catch (error) {
      throw new PlanError(`cannot fetch artifact ${file}: ${error.message}`);
    }
    if (!body.ok) throw await refusal(body, `artifact ${file}`);
    const buffer = await readCapped(body, size, file);
    if (buffer.byteLength !== size) {
      throw new PlanError(`artifact ${file}: expected ${size} bytes, found ${buffer.byteLength}; nothing was cached`);
    }
    const found = hex(await crypto.subtle.digest("SHA-256", buffer));
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
      const response = new Response(artifacts.get(file).slice(0), {
        headers: { "Content-Type": "application/octet-stream", "X-Content-SHA256": files.find((f) => f.file === file).sha256 },
      });
      await cache.put(cacheKey(file), response);
    }
  }
  return { plan, artifacts, fetched: verified, cached, seconds: (performance.now() - started) / 1000 };
}
