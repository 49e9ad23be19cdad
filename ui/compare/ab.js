// Latency Lab A/B tab: one prompt through panes A and B (which runs first alternates), then the delta
// table; the teaching presets (a seeded history, then their turns). Runs go through the chat's `run`.
import { clear, pressed, settingsOf, stop } from "../chat/actions.js";
import { run } from "../chat/run.js";
import { addAssistant, addUser } from "../chat/transcript.js";
import { errorText, postJSON } from "../shell/http.js";

const q = (sel) => document.querySelector(sel);

// Which pane runs first alternates per prompt and settings (cfg.abOrder, ABBA, after cfg.abWarmup
// warm-up pairs run A first), so what a pair's first run warms up helps A and B alike; the server reads
// each pair's order from its own stamps (ui/compare/repeated.py).
const pairsRun = new Map(); // [prompt, A's settings, B's settings] → pairs run so far in this tab

function order(cfg, prompt, sA, sB) {
  const key = JSON.stringify([prompt, sA, sB]);
  const k = pairsRun.get(key) || 0;
  pairsRun.set(key, k + 1);
  return k < cfg.abWarmup ? "AB" : cfg.abOrder[(k - cfg.abWarmup) % cfg.abOrder.length];
}

// The same prompt through both panes, one after the other; overlays on one time scale.
async function abTurn(session, prompt, sA, sB, transport, pressedAt, what = "") {
  const first = order(session.cfg, prompt, sA, sB);
  const settings = { A: sA, B: sB }, out = {};
  let sendAt = pressedAt ?? performance.now();
  abStatus(`${what}running ${first[0]}, then ${first[1]}…`);
  for (const [i, p] of [...first].entries()) {
    addUser(p, prompt);
    out[p] = await run(session, p, { message: prompt, settings: settings[p] }, sendAt, transport, `${p} · ran ${i ? "second" : "first"}`);
    sendAt = performance.now();
  }
  return [out.A, out.B];
}

async function showDelta(session, a, b) {
  const el = q("#lab-delta .lab-delta-wrap");
  if (!el) return;
  if (!a.requestId || !b.requestId || a.error || b.error) {
    el.innerHTML = `<div class="lab-muted">${a.error || b.error || "no pair to compare"}</div>`;
    return;
  }
  const r = await fetch(`/lab/delta?session=${encodeURIComponent(session.id)}&a=${a.requestId}&b=${b.requestId}`);
  el.innerHTML = r.ok ? (await r.json()).html : await errorText(r);
}

function abStatus(text) { const el = q("#lab-ab-status"); if (el) el.textContent = text; }

// [prompt, ...A's settings, ...B's settings, transport, pace] → the new value of the prompt box.
export function runAB(session, args) {
  const pressedAt = pressed(session);
  const [prompt, ...rest] = args;
  const fields = session.cfg.fields, n = fields.length;
  if (!prompt || !prompt.trim() || session.busy()) return prompt;
  const sA = settingsOf(fields, rest.slice(0, n)), sB = settingsOf(fields, rest.slice(n, 2 * n));
  const transport = rest[2 * n];
  session.pane("A").pace = session.pane("B").pace = rest[2 * n + 1] || session.cfg.readingPace;
  abTurn(session, prompt, sA, sB, transport, pressedAt).then(([a, b]) => { abStatus(""); return showDelta(session, a, b); });
  return "";
}

export async function runPreset(session, name, args) {
  const preset = session.cfg.presets[name];
  if (!preset || !preset.available || session.busy()) return; // the note under the buttons says why
  const fields = session.cfg.fields, n = fields.length;
  const sA = settingsOf(fields, args.slice(0, n)), sB = settingsOf(fields, args.slice(n, 2 * n));
  const transport = args[2 * n];
  await session.ready;
  for (const p of ["A", "B"]) {
    await clear(session, p);
    const r = await postJSON("/lab/seed", { session: session.id, pane: p, preset: name });
    if (!r.ok) { abStatus(await errorText(r)); return; }
    for (const m of (await r.json()).messages) {
      if (m.role === "user") addUser(p, m.content, true);
      else {
        const v = addAssistant(p, "preset history", session.markdown);
        v.text.appendData(m.content);
        v.status.style.display = "none";
        v.el.classList.add("seeded");
      }
    }
  }
  let pair = null;
  for (let i = 0; i < preset.turns.length; i++) {
    pair = await abTurn(session, preset.turns[i], sA, sB, transport, undefined, `${preset.title}: turn ${i + 1} of ${preset.turns.length}, `);
    if (pair[0].error || pair[1].error) break;
  }
  abStatus("");
  if (pair) await showDelta(session, pair[0], pair[1]);
}

export const stopAB = (session) => Promise.all([stop(session, "A"), stop(session, "B")]);
