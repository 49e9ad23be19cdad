// One run of a pane: send → stream → timings. The token stream is ours: a POST to /lab/chat answered
// with SSE, read with fetch, one event per chunk, so each chunk's arrival and paint are stamped (see
// ui/chat/routes.py for why); the "gradio" transport sends the same request through Gradio's queue.
//
// Perceived latency: the user's message and a status are on screen within a frame of send (and the
// status says what the server does: queued, processing the prompt — with a progress bar when it
// prefills in chunks —, writing); `show` below is the one place where text goes on the page, and the
// smoothing (ui/chat/smooth.js) holds text back and releases it frame by frame through it.
import { showClock } from "../shell/header.js";
import { errorText, postJSON } from "../shell/http.js";
import { Recorder } from "./client_timing.js";
import { drawPane, scheduleDraw, ticker } from "./draw.js";
import { viaGradio } from "./gradio_transport.js";
import { Smoother } from "./smooth.js";
import { viaSSE } from "./sse_transport.js";
import { showTable, tableShown } from "./table.js";
import { ThoughtFold } from "./thought.js";
import { addAssistant, scrollSoon, setProgress, setStatus } from "./transcript.js";

const STAGE_TEXT = {
  queued: (d) => (d.position ? `queued: ${d.position} request${d.position > 1 ? "s" : ""} ahead` : "queued"),
  setup: () => "preparing the prompt…",
  prefill: (d) => (d.prefill_tokens != null ? `processing the prompt (${d.prefill_tokens.toLocaleString("en-US")} tokens)…` : "processing the prompt…"),
};

// Put reply text on the page (at once, or from the smoothing frame loop: inFrame).
function show(session, run, text, t, inFrame) {
  const t0 = performance.now();
  const answer = run.fold.show(run.textLen, text); // an opening thought goes into its fold
  if (answer) run.view.text.appendData(answer); // markdown re-renders only the open tail block (plain: O(1))
  const c = session.renderCost, cost = performance.now() - t0;
  c.n += 1; c.total += cost; c.max = Math.max(c.max, cost);
  // this update's cost split: parsing markdown into detached nodes, and the rest (the page's DOM)
  const md = answer && run.view.text.last ? run.view.text.last.markdown : 0;
  run.costs.push([run.textLen + text.length, md, cost - md]);
  run.textLen += text.length;
  run.rec.shown(run.textLen, t, inFrame);
  if (!run.writing) {
    run.writing = true;
    setStatus(run, "writing…");
    run.view.status.className = "lab-status lab-writing";
  }
  scrollSoon(run.pane);
}

// Smoothing: one frame loop per reply while text waits; each frame takes what is due.
function pump(session, run) {
  if (run.pumping) return;
  run.pumping = true;
  const step = () => {
    const now = performance.now();
    const text = run.smoother.take(now);
    if (text) show(session, run, text, now, true);
    if (run.smoother.idle) {
      run.pumping = false;
      if (run.smoother.ended && run.drained) run.drained();
      return;
    }
    requestAnimationFrame(step);
  };
  requestAnimationFrame(step);
}

// The stream is over: let the smoother release what it still holds (or all of it at once: flush).
export function drain(session, run, flush) {
  const s = run.smoother;
  if (!s) return Promise.resolve();
  s.end();
  if (flush && !s.idle) show(session, run, s.flush(), performance.now(), false);
  if (s.idle) return Promise.resolve();
  return new Promise((resolve) => { run.drained = resolve; pump(session, run); });
}

// One event of the stream (SSE or Gradio's), `t`: when its bytes arrived.
function onEvent(session, r, kind, d, t) {
  if (kind === "start") {
    r.requestId = d.request_id;
    r.timeline.received_ns = d.received_ns;
    const meta = r.view.el.querySelector(".lab-meta");
    meta.textContent = (meta.textContent ? meta.textContent + " · " : "") + d.config;
  } else if (kind === "status") {
    Object.assign(r.timeline.events_ms, d.events_ms || {});
    if (d.prefilled_tokens != null && d.prefill_tokens > 0) setProgress(r, d.prefilled_tokens, d.prefill_tokens, t);
    else setStatus(r, (STAGE_TEXT[d.stage] || (() => d.stage))(d));
    r.rec.stamp("status");
  } else if (kind === "chunk") {
    r.timeline.token_ms.push(...d.token_ms);
    if (d.events_ms) Object.assign(r.timeline.events_ms, d.events_ms); // the thought's instants so far
    if (d.marks) r.rec.marks = d.marks;
    r.fold.update(d.marks, d.n);
    r.rec.arrived(d.n, d.text ? d.text.length : 0, t);
    if (d.text && r.smoother) {
      r.smoother.push(d.text, t, d.n);
      pump(session, r);
    } else if (d.text) {
      show(session, r, d.text, t, false);
    }
    scheduleDraw(session, r.pane);
  } else if (kind === "done") {
    r.timeline = d.record.timeline;
    r.record = d.record;
    r.row = d.row;
  } else if (kind === "error") {
    r.requestId = d.request_id || r.requestId;
    throw new Error(d.message);
  }
}

// A finished reply crosses the wire once after its stream (POST /lab/turn): the browser's timings go up;
// its row, stats line, what happened, the tab's table (when shown) and what goes under it come back, and
// the server's clock as it answered: one more sample of the clock offset, so no pings follow a reply.
async function postTurn(session, r) {
  if (!r.requestId) return;
  const extra = { smoothing: { mode: r.smoothing.mode, unit: r.smoothing.unit, max_hold_ms: r.smoothing.maxHoldMs },
    reading_pace_tps: session.pane(r.pane).pace };
  const t0 = performance.now();
  const resp = await postJSON("/lab/turn", { session: session.id, request_id: r.requestId,
    client: r.rec.toClient(r.transport, extra), table: tableShown(r.pane) });
  if (!resp.ok) { r.view.el.querySelector(".lab-stats").textContent = await errorText(resp); return; }
  const j = await resp.json();
  session.clock.add(t0, j.server_ms, performance.now());
  showClock(session.clock);
  r.turn = j; // what goes under the reply reads it too (ui/insight/replay.js)
  if (j.table_html != null) showTable(session, r.pane, j.table_html);
  r.row = j.row;
  r.client = j.client;
  r.timeline.client = j.client;
  r.view.el.querySelector(".lab-stats").innerHTML = j.stats_html;
  r.view.el.querySelector(".lab-perceived").innerHTML = j.perceived_html || "";
  r.view.el.querySelector(".lab-what").textContent = j.what_happened;
  r.fold.joined(j.client, r.timeline);
}

// Returns a promise that resolves when the reply is done and its timings are joined: one request (the
// stream) before, one (its turn) after.
export async function run(session, p, body, sendAt, transport, meta) {
  const P = session.pane(p);
  const s = body.settings || {};
  const r = {
    // settings: what this request sent (the pane's controls' values)
    pane: p, settings: s, sendAt, transport, rec: new Recorder(sendAt, session.clock), finished: false, error: null,
    timeline: { received_ns: null, events_ms: {}, token_ms: [] }, requestId: null, row: null, client: null,
    view: addAssistant(p, meta || "", session.markdown), textLen: 0, progress: [], costs: [],
    smoothing: { mode: s.smoothing || "off", unit: s.smooth_unit || "word", maxHoldMs: session.cfg.smoothMaxHoldMs, paceTps: P.pace },
  };
  r.fold = new ThoughtFold(r.view.el.querySelector(".lab-bubble"));
  r.smoother = r.smoothing.mode === "off" ? null : new Smoother(r.smoothing);
  r.rec.stamp("feedback"); // the user's message and "sending…" are in the DOM now: the next frame shows them
  r.view.el.addEventListener("click", () => { P.selected = r; drawPane(session, p); });
  P.run = r;
  P.selected = r;
  P.runs.push(r);
  ticker(session);
  try {
    await session.ready;
    const payload = Object.assign({ session: session.id, pane: p }, body);
    const handle = (kind, d, t) => onEvent(session, r, kind, d, t);
    if (transport === "gradio") await viaGradio(r, payload, handle);
    else await viaSSE(r, payload, handle);
    await drain(session, r, false);
    setStatus(r, r.row && r.row.finish_reason === "cancelled" ? "stopped" : "");
  } catch (err) {
    r.error = String(err.message || err);
    if (r.smoother) r.smoother.flush();
  }
  r.finished = true;
  if (r.error) {
    setStatus(r, "");
    r.view.el.classList.add("error");
    r.view.el.querySelector(".lab-bubble").textContent = r.error;
  } else {
    await r.rec.settled(); // the last chunk's paint time
    await postTurn(session, r);
    for (const hook of session.afterReply) await hook(session, r); // the Trace link, the replay, the what-if
  }
  drawPane(session, p);
  return r;
}
