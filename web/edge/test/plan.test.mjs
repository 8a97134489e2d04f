// Fetching a plan: every artifact checked by size and sha256 on each load, downloaded once (cached by plan id),
// refused when wrong. (What a plan may say is the shared table's: plan_cases.test.mjs.)

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { PlanError, checkStreamStart, loadPlan } from "../plan.mjs";
import { CodecStreamParser, MalformedMessageError, PROTOCOL } from "../stream.mjs";
import { fixturePath, readJson } from "../testing/fixtures.mjs";

const cases = readJson("decode", "cases.json");
const fixturePlanText = readFileSync(fixturePath("decode", cases.plan_dir, "exec_plan.json"), "utf8");
const fixturePlan = JSON.parse(fixturePlanText);
// The tests below fetch one file: the graph, its external data left out of the plan (only sizes and sha256s count)
const plan = structuredClone(fixturePlan);
for (const artifact of Object.values(plan.artifacts)) delete artifact.external_data;
const planText = JSON.stringify(plan);
const file = plan.artifacts.main.file;
const graph = readFileSync(fixturePath("decode", cases.plan_dir, file));

/**
 * A server of the plan: records requests; `damage` flips a byte of the artifact; `key` is the API key it wants;
 * `text` and `path` are the plan it serves and the URL path of its artifact.
 */
function server({ damage = false, key = null, body = graph, text = planText, path = file } = {}) {
  const requests = [];
  const fetch = async (url, { headers = {} } = {}) => {
    requests.push(url);
    if (key && headers.Authorization !== `Bearer ${key}`) {
      return Response.json({ error: { message: "invalid API key", type: "invalid_request_error" } }, { status: 401 });
    }
    if (url === "http://edge.test/v1/edge/plans/browser") return new Response(text);
    if (url === `http://edge.test/v1/edge/plans/browser/artifacts/${path}`) {
      const bytes = Uint8Array.from(body);
      if (damage) bytes[1000] ^= 0xff;
      return new Response(bytes);
    }
    return Response.json({ error: { message: `no ${url}` } }, { status: 404 });
  };
  return { fetch, requests };
}

/** A Cache-Storage-like cache in memory. */
function memoryCache() {
  const entries = new Map();
  return {
    entries,
    async match(key) {
      const hit = entries.get(String(key));
      return hit ? new Response(hit) : undefined;
    },
    async put(key, response) {
      entries.set(String(key), new Uint8Array(await response.arrayBuffer()));
    },
  };
}

/** WebCrypto that counts digests. */
function countingCrypto() {
  const counter = { digests: 0 };
  counter.subtle = {
    digest: async (algorithm, data) => {
      counter.digests++;
      return globalThis.crypto.subtle.digest(algorithm, data);
    },
  };
  return counter;
}

const options = (extra) => ({ baseUrl: "http://edge.test", hardwareClass: "browser", ...extra });

test("a plan loads, each file is fetched once, and a second load hashes the cached copy instead", async () => {
  const cache = memoryCache();
  const crypto = countingCrypto();
  const first = server();
  const loaded = await loadPlan(options({ fetch: first.fetch, cache, crypto }));
  assert.equal(loaded.plan.plan_id, plan.plan_id);
  assert.deepStrictEqual([...loaded.artifacts.keys()], [file], "first and main name one file: fetched once");
  assert.equal(loaded.artifacts.get(file).byteLength, plan.artifacts.main.size_bytes);
  assert.deepStrictEqual(loaded.fetched, [file]);
  assert.equal(crypto.digests, 1);
  assert.equal(cache.entries.size, 1);
  assert.ok([...cache.entries.keys()][0].includes(plan.plan_id), "cached under the plan id");

  const again = server();
  const reloaded = await loadPlan(options({ fetch: again.fetch, cache, crypto }));
  assert.equal(crypto.digests, 2, "the cached copy is hashed: Cache Storage has no identity to remember a check by");
  assert.deepStrictEqual(reloaded.cached, [file]);
  assert.deepStrictEqual(reloaded.damaged, []);
  assert.deepStrictEqual(again.requests, ["http://edge.test/v1/edge/plans/browser"], "only the plan is fetched again");
  assert.deepStrictEqual(new Uint8Array(reloaded.artifacts.get(file)), new Uint8Array(graph));
});

test("a cached copy of the right size but another sha256 is fetched again and replaced", async () => {
  const cache = memoryCache();
  await loadPlan(options({ fetch: server().fetch, cache }));
  const [key] = cache.entries.keys();
  cache.entries.get(key)[1000] ^= 0xff; // same size, other bytes
  const again = server();
  const reloaded = await loadPlan(options({ fetch: again.fetch, cache }));
  assert.deepStrictEqual(reloaded.damaged, [file]);
  assert.deepStrictEqual(reloaded.cached, []);
  assert.deepStrictEqual(reloaded.fetched, [file]);
  assert.equal(again.requests.length, 2, "the plan and the artifact");
  assert.deepStrictEqual(new Uint8Array(reloaded.artifacts.get(file)), new Uint8Array(graph));
  assert.deepStrictEqual(cache.entries.get(key), new Uint8Array(graph), "the cache entry is replaced");
});

test("a graph's external data file is fetched and checked like the graph, once for both roles", async () => {
  const weights = fixturePlan.artifacts.main.external_data;
  assert.ok(weights, "the browser plan keeps its weights beside the graph");
  const data = readFileSync(fixturePath("decode", cases.plan_dir, weights.file));
  const both = server({ text: fixturePlanText });
  const inner = both.fetch;
  const fetch = async (url, init) =>
    url.endsWith(`/artifacts/${weights.file}`) ? new Response(Uint8Array.from(data)) : inner(url, init);
  const loaded = await loadPlan(options({ fetch }));
  assert.deepStrictEqual(loaded.fetched, [file, weights.file]);
  assert.deepStrictEqual(new Uint8Array(loaded.artifacts.get(weights.file)), new Uint8Array(data));
  const damaged = async (url, init) => {
    if (!url.endsWith(`/artifacts/${weights.file}`)) return inner(url, init);
    const bytes = Uint8Array.from(data);
    bytes[7] ^= 0xff;
    return new Response(bytes);
  };
  await assert.rejects(loadPlan(options({ fetch: damaged })), (error) => {
    assert.ok(error instanceof PlanError && error.message.startsWith(`artifact ${weights.file}: sha256 mismatch`));
    return true;
  });
});

test("an artifact in a subfolder is fetched at its path, each segment escaped", async () => {
  const nested = structuredClone(plan);
  for (const role of Object.keys(nested.artifacts)) nested.artifacts[role].file = "graphs/step b.onnx";
  const path = "graphs/step%20b.onnx";
  const loaded = await loadPlan(options({ fetch: server({ text: JSON.stringify(nested), path }).fetch }));
  assert.deepStrictEqual(loaded.fetched, ["graphs/step b.onnx"]);
  assert.deepStrictEqual(new Uint8Array(loaded.artifacts.get("graphs/step b.onnx")), new Uint8Array(graph));
});

test("a plan that breaks its schema is refused before any artifact is fetched", async () => {
  const broken = structuredClone(plan);
  broken.artifacts.main.size_bytes = 0;
  const refusing = server({ text: JSON.stringify(broken) });
  await assert.rejects(loadPlan(options({ fetch: refusing.fetch })), (error) => {
    assert.ok(error instanceof PlanError);
    assert.equal(error.field, "artifacts.main.size_bytes");
    assert.equal(error.message, "the browser plan: artifacts.main.size_bytes: must be at least 1, found 0");
    return true;
  });
  assert.deepStrictEqual(refusing.requests, ["http://edge.test/v1/edge/plans/browser"]);
});

test("a wrong sha256 throws PlanError naming the file, expected and found, and caches nothing", async () => {
  const cache = memoryCache();
  await assert.rejects(loadPlan(options({ fetch: server({ damage: true }).fetch, cache })), (error) => {
    assert.ok(error instanceof PlanError, error.name);
    assert.match(error.message, new RegExp(`artifact ${file.replace(".", "\\.")}: sha256 mismatch`));
    assert.ok(error.message.includes(`expected ${plan.artifacts.main.sha256}`), error.message);
    assert.match(error.message, /found [0-9a-f]{64}/);
    return true;
  });
  assert.equal(cache.entries.size, 0);
});

test("a body longer or shorter than size_bytes is refused before hashing", async () => {
  const crypto = countingCrypto();
  const longer = new Uint8Array(graph.length + 1);
  longer.set(graph);
  await assert.rejects(loadPlan(options({ fetch: server({ body: longer }).fetch, crypto })), /the body is longer/);
  await assert.rejects(loadPlan(options({ fetch: server({ body: graph.subarray(1) }).fetch, crypto })), /found \d+/);
  assert.equal(crypto.digests, 0);
});

test("the API key is sent; a wrong one is a PlanError saying so", async () => {
  const keyed = server({ key: "s3cret" });
  const loaded = await loadPlan(options({ fetch: keyed.fetch, apiKey: "s3cret" }));
  assert.equal(loaded.plan.plan_id, plan.plan_id);
  await assert.rejects(loadPlan(options({ fetch: keyed.fetch, apiKey: "wrong" })), (error) => {
    assert.ok(error instanceof PlanError);
    assert.equal(error.status, 401);
    assert.match(error.message, /refused the API key \(401\).*invalid API key/);
    return true;
  });
});

/** The start event a stream made for `plan` gives, with `changes`. */
function startFor(target, changes = {}) {
  const row = {
    type: "start",
    protocol: PROTOCOL,
    version: 1,
    num_quantizers: target.num_quantizers,
    codebook_size: target.codebook_size,
    frame_rate: target.sample_rate / target.samples_per_frame,
    sample_rate: target.sample_rate,
    packing: "packed11",
    max_frames_per_message: 4,
    plan_id: target.plan_id,
    ...changes,
  };
  return new CodecStreamParser().handleText(JSON.stringify(row));
}

test("a stream is decoded only with the plan it was made for: plan id, codebooks, sizes, sample and frame rate", () => {
  checkStreamStart(startFor(plan), plan);
  const rate = plan.sample_rate / plan.samples_per_frame;
  checkStreamStart(startFor(plan, { frame_rate: rate * (1 + 1e-7) }), plan); // within a relative 1e-6
  assert.throws(() => checkStreamStart(startFor(plan, { plan_id: "ab".repeat(32) }), plan), (error) => {
    assert.ok(error instanceof PlanError && error.message.includes("reload the plan"), error.message);
    return true;
  });
  for (const [key, value] of [
    ["frame_rate", rate * 2],
    ["frame_rate", rate * (1 + 1e-5)],
    ["num_quantizers", plan.num_quantizers - 1],
    ["codebook_size", 1024],
    ["sample_rate", plan.sample_rate / 2],
  ]) {
    assert.throws(() => checkStreamStart(startFor(plan, { [key]: value, plan_id: undefined }), plan), (error) => {
      assert.ok(error instanceof MalformedMessageError, `${key}: ${error.name}`);
      assert.ok(error.message.includes(`${key}: stream ${value}, plan `), error.message);
      return true;
    }, `${key} ${value}`);
  }
});
