// The page's requests to its own endpoints: JSON posted, and an error body read as the page shows it.

// A 4xx's words: our {message} detail, FastAPI's validation list, or the API's OpenAI-shaped error.
export async function errorText(resp) {
  try {
    const body = await resp.json();
    const d = body.detail;
    if (typeof d === "string") return d;
    if (d && d.message) return d.message;
    if (Array.isArray(d)) return d.map((e) => e.msg).join("; ");
    if (body.error && body.error.message) return body.error.message; // an OpenAI-shaped error body
    return JSON.stringify(body);
  } catch (e) {
    return `${resp.status} ${resp.statusText}`;
  }
}

export function postJSON(url, body) {
  return fetch(url, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
}

// GET a JSON body; an error response throws its words.
export async function getJSON(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(await errorText(r));
  return r.json();
}
