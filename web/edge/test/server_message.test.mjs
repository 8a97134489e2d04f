// The one-line reason of a refused request, as the page and the plan loader show it.

import assert from "node:assert/strict";
import { test } from "node:test";

import { serverMessage } from "../server_message.mjs";

test("the reason is the API's error message, FastAPI's detail, the body's start, or the status", async () => {
  const api = Response.json({ error: { message: "invalid API key", type: "invalid_request_error" } }, { status: 401 });
  assert.equal(await serverMessage(api), "invalid API key");
  assert.equal(await serverMessage(Response.json({ detail: "Not Found" }, { status: 404 })), "Not Found");
  const listed = Response.json({ detail: [{ loc: ["body", "input"], msg: "field required" }] }, { status: 422 });
  assert.equal(await serverMessage(listed), '{"detail":[{"loc":["body","input"],"msg":"field required"}]}');
  const text = new Response("/edge/browser/x.mjs is not a file\n of the browser page", { status: 404 });
  assert.equal(await serverMessage(text), "/edge/browser/x.mjs is not a file of the browser page");
  assert.equal(await serverMessage(new Response("", { status: 502, statusText: "Bad Gateway" })), "Bad Gateway");
  assert.equal(await serverMessage(new Response("", { status: 503 })), "HTTP 503");
});

test("a body that cannot be read gives the status, never an exception", async () => {
  const body = new ReadableStream({ pull: (controller) => controller.error(new Error("reset")) });
  assert.equal(await serverMessage(new Response(body, { status: 500 })), "HTTP 500");
});
