// The reason a server gives for refusing a request, in one line: what the page and the plan loader show.

/**
 * A one-line reason from a refused `response`: `error.message` of an OpenAI-style body (the API's refusals),
 * FastAPI's `detail`, else the start of the body, else the status text. Reads the body; never throws.
 */
export async function serverMessage(response) {
  const status = response.statusText || `HTTP ${response.status}`;
  let text;
  try {
    text = await response.text();
  } catch {
    return status;
  }
  let body;
  try {
    body = JSON.parse(text);
  } catch {
    return text.trim().replace(/\s+/g, " ").slice(0, 200) || status;
  }
  const reason = body?.error?.message ?? body?.detail;
  return typeof reason === "string" ? reason : JSON.stringify(body).slice(0, 200);
}
