// Latency Lab page controller: sends messages, reads the token stream, renders the transcript,
// stamps browser timings (client_timing.js) and redraws the overlays (overlays.js) live.
//
// Gradio owns the controls; the buttons' `js` handlers call into `window.lab` with the controls'
// values. The token stream is ours: a POST to /lab/chat answered with SSE, read with fetch, one
// event per chunk, so each chunk's arrival and paint are stamped (see ui/chat/routes.py for why).
// The "gradio" transport sends the same request through Gradio's queue instead, to measure it.
//
// Perceived latency: the user's message and a status are on screen within a frame of send (and
// the status says what the server does: queued, processing the prompt — with a progress bar when
// it prefills in chunks —, writing); chunk handling below is the one place where smoothing
// (ui/chat/smooth.js) holds text back and releases it frame by frame.
(function () {
  "use strict";
  const CFG = window.LAB_CONFIG;
  const G = CFG.glossary;
  const { Clock, Recorder } = window.LabTiming;
  const O = window.LabOverlays;
  const DRAW_EVERY_MS = 100; // live overlay redraws at most ~10 per second

  const lab = (window.lab = {
    session: null,
    panes: {},
    overlayCost: { n: 0, total: 0, max: 0 },
    renderCost: { n: 0, total: 0, max: 0 }, // ms of main thread per text update (markdown or plain)
    markdown: CFG.markdown !== false,
    pendingGradio: null,
    gradioRun: null,
    afterReply: [], // functions of a finished reply's run, called after its timings are joined
  });

  const pane = (name) => (lab.panes[name] ||= { name, runs: [], run: null, selected: null, pace: CFG.readingPace, draw: null, lastDraw: 0 });
  const q = (sel) => document.querySelector(sel);
  const logEl = (p) => q(`#lab-log-${p} .lab-log`);
  const overlayEl = (p) => q(`#lab-ov-${p} .lab-ov`);

  // ---- start-up: a session of our own and a first clock estimate --------------------------------
  const ready = (async () => {
    const r = await fetch("/lab/session", { method: "POST" });
    lab.session = (await r.json()).session;
    await Clock.sync(5).catch(() => null);
    showClock();
    setInterval(() => { if (!busy()) Clock.sync(3).then(showClock).catch(() => null); }, 30000);
    return lab.session;
  })();

  function showClock() {
    const el = q("#lab-clock");
    if (!el) return;
    el.textContent = Clock.offset == null ? "clock offset: unknown" : `clock offset ±${O.fmtMs(Clock.bound)}`;
    el.title = "Server and browser clocks are aligned NTP-style: several pings to the server, keeping the one with the shortest round trip; the bound is half that round trip. Only cross-clock figures (network in/out) use it.";
  }

  const busy = () => Object.values(lab.panes).some((p) => p.run && !p.run.finished);

  // "User pressed send" is the DOM event itself (click, or Enter in the message box), stamped in
  // the capture phase before Gradio dispatches its handler to us.
  lab.pressedAt = null;
  const SEND_BUTTONS = "#lab-send, #lab-ab-run";
  const SEND_BOXES = "#lab-msg textarea, #lab-ab-msg textarea";
  document.addEventListener("click", (e) => { if (e.target.closest?.(SEND_BUTTONS)) lab.pressedAt = performance.now(); }, true);
  document.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && e.target.matches?.(SEND_BOXES)) lab.pressedAt = performance.now();
  }, true);
  function pressed() {
    const now = performance.now();
    const t = lab.pressedAt != null && now - lab.pressedAt < 1000 ? lab.pressedAt : now;
    lab.pressedAt = null;
    return t;
  }

  function settingsOf(values) {
    const s = {};
    CFG.fields.forEach((name, i) => { s[name] = values[i]; });
    if (s.seed === "" || s.seed == null) s.seed = null;
    return s;
  }

  // ---- transcript --------------------------------------------------------------------------------
  function scrollDown(p) {
    const log = logEl(p);
    if (log) log.scrollTop = log.scrollHeight;
  }

  // Once per frame, not per chunk: reading scrollHeight forces a layout, and a layout per chunk
  // is what made long fast replies fall behind.
  const scrollPending = new Set();
  function scrollSoon(p) {
    if (scrollPending.has(p)) return;
    scrollPending.add(p);
    requestAnimationFrame(() => { scrollPending.delete(p); scrollDown(p); });
  }

  function addUser(p, text, note) {
    const log = logEl(p);
    log.querySelector(".lab-empty")?.remove();
    const el = document.createElement("div");
    el.className = "lab-msg user" + (note ? " seeded" : "");
    const b = document.createElement("div");
    b.className = "lab-bubble";
    b.textContent = text;
    el.appendChild(b);
    log.appendChild(el);
    scrollDown(p);
    return el;
  }

  function addAssistant(p, label) {
    const log = logEl(p);
    log.querySelector(".lab-empty")?.remove();
    const el = document.createElement("div");
    el.className = "lab-msg assistant";
    el.innerHTML = `<div class="lab-meta"></div><div class="lab-bubble"><div class="lab-text lab-md"></div><span class="lab-status">sending…</span></div><div class="lab-stats"></div><div class="lab-perceived"></div><div class="lab-what"></div>`;
    el.querySelector(".lab-meta").textContent = label || "";
    // markdown as DOM nodes, model text only through textContent (ui/chat/markdown.js); plain: a Text node
    const box = el.querySelector(".lab-text");
    const text = lab.markdown ? new window.LabMarkdown.Renderer(box) : box.appendChild(document.createTextNode(""));
    log.appendChild(el);
    scrollDown(p);
    return { el, text, status: el.querySelector(".lab-status") };
  }

  function setStatus(run, text) {
    run.view.status.textContent = text || "";
    run.view.status.className = "lab-status";
    run.view.status.style.display = text ? "" : "none";
  }

  // Chunked prefill reports prompt tokens processed / total: a progress bar instead of a frozen wait.
  function setProgress(run, done, total, t) {
    const pct = Math.max(0, Math.min(100, (100 * done) / total));
    const el = run.view.status;
    el.className = "lab-status lab-progressing";
    el.style.display = "";
    el.innerHTML = `<span class="lab-progress" role="progressbar" aria-valuemin="0" aria-valuemax="${total}" aria-valuenow="${done}"><span class="lab-progress-bar" style="width:${pct.toFixed(1)}%"></span></span> processing the prompt: ${done.toLocaleString("en-US")} / ${total.toLocaleString("en-US")} tokens`;
    run.progress.push([t - run.sendAt, done, total]);
  }

  // Put reply text on the page (at once, or from the smoothing frame loop: inFrame).
  function show(run, text, t, inFrame) {
    const t0 = performance.now();
    run.view.text.appendData(text); // markdown re-renders only the open tail block (plain: O(1))
    const c = lab.renderCost, cost = performance.now() - t0;
    c.n += 1; c.total += cost; c.max = Math.max(c.max, cost);
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
  function pump(run) {
    if (run.pumping) return;
    run.pumping = true;
    const step = () => {
      const now = performance.now();
      const text = run.smoother.take(now);
      if (text) show(run, text, now, true);
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
  function drain(run, flush) {
    const s = run.smoother;
    if (!s) return Promise.resolve();
    s.end();
    if (flush && !s.idle) show(run, s.flush(), performance.now(), false);
    if (s.idle) return Promise.resolve();
    return new Promise((resolve) => { run.drained = resolve; pump(run); });
  }

  // ---- one run: send → stream → timings ---------------------------------------------------------
  // Returns a promise that resolves when the reply is done and its timings are joined.
  async function run(p, body, sendAt, transport, meta) {
    const P = pane(p);
    const s = body.settings || {};
    const r = {
      pane: p, sendAt, transport, rec: new Recorder(sendAt), finished: false, error: null,
      timeline: { received_ns: null, events_ms: {}, token_ms: [] }, requestId: null, row: null, client: null,
      view: addAssistant(p, meta || ""), textLen: 0, progress: [],
      smoothing: { mode: s.smoothing || "off", unit: s.smooth_unit || "word", maxHoldMs: CFG.smoothMaxHoldMs, paceTps: P.pace },
    };
    r.smoother = r.smoothing.mode === "off" ? null : new window.LabSmooth.Smoother(r.smoothing);
    r.rec.stamp("feedback"); // the user's message and "sending…" are in the DOM now: the next frame shows them
    r.view.el.addEventListener("click", () => { P.selected = r; drawPane(p); });
    P.run = r;
    P.selected = r;
    P.runs.push(r);
    ticker();
    try {
      await ready;
      const payload = Object.assign({ session: lab.session, pane: p }, body);
      if (transport === "gradio") await lab.viaGradio(r, payload); // ui/chat/gradio_transport.js
      else await lab.viaSSE(r, payload); // ui/chat/sse_transport.js
      await drain(r, false);
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
      await postTiming(r);
      for (const hook of lab.afterReply) await hook(r); // the Trace link, the replay, the what-if (ui/*.js)
    }
    drawPane(p);
    refreshTable(p);
    if (!busy()) Clock.sync(3).then(showClock).catch(() => null); // fresh pings keep the offset's bound tight
    return r;
  }

  async function errorText(resp) {
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

  const STAGE_TEXT = {
    queued: (d) => (d.position ? `queued: ${d.position} request${d.position > 1 ? "s" : ""} ahead` : "queued"),
    setup: () => "preparing the prompt…",
    prefill: (d) => (d.prefill_tokens != null ? `processing the prompt (${d.prefill_tokens.toLocaleString("en-US")} tokens)…` : "processing the prompt…"),
  };

  function onEvent(r, kind, d, t) {
    if (kind === "start") {
      r.requestId = d.request_id;
      r.timeline.received_ns = d.received_ns;
      r.view.el.querySelector(".lab-meta").textContent = (r.view.el.querySelector(".lab-meta").textContent ? r.view.el.querySelector(".lab-meta").textContent + " · " : "") + d.config;
    } else if (kind === "status") {
      Object.assign(r.timeline.events_ms, d.events_ms || {});
      if (d.prefilled_tokens != null && d.prefill_tokens > 0) setProgress(r, d.prefilled_tokens, d.prefill_tokens, t);
      else setStatus(r, (STAGE_TEXT[d.stage] || (() => d.stage))(d));
      r.rec.stamp("status");
    } else if (kind === "chunk") {
      r.timeline.token_ms.push(...d.token_ms);
      r.rec.arrived(d.n, d.text ? d.text.length : 0, t);
      if (d.text && r.smoother) {
        r.smoother.push(d.text, t, d.n);
        pump(r);
      } else if (d.text) {
        show(r, d.text, t, false);
      }
      scheduleDraw(r.pane);
    } else if (kind === "done") {
      r.timeline = d.record.timeline;
      r.record = d.record;
      r.row = d.row;
    } else if (kind === "error") {
      r.requestId = d.request_id || r.requestId;
      throw new Error(d.message);
    }
  }

  async function postTiming(r) {
    if (!r.requestId) return;
    const extra = { smoothing: { mode: r.smoothing.mode, unit: r.smoothing.unit, max_hold_ms: r.smoothing.maxHoldMs },
      reading_pace_tps: pane(r.pane).pace };
    const body = { session: lab.session, request_id: r.requestId, client: r.rec.toClient(r.transport, extra) };
    const resp = await fetch("/lab/timing", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    if (!resp.ok) { r.view.el.querySelector(".lab-stats").textContent = await errorText(resp); return; }
    const j = await resp.json();
    r.row = j.row;
    r.client = j.client;
    r.timeline.client = j.client;
    r.view.el.querySelector(".lab-stats").innerHTML = j.stats_html;
    r.view.el.querySelector(".lab-perceived").innerHTML = j.perceived_html || "";
    r.view.el.querySelector(".lab-what").textContent = j.what_happened;
  }

  // ---- overlays -----------------------------------------------------------------------------------
  function viewOfRun(r) {
    const client = r.client || r.rec.toClient(r.transport);
    const variant = r.record?.settings?.quantization || null;
    return O.viewOf(r.timeline, client, {
      now: r.finished ? null : performance.now() - r.sendAt,
      readingPace: pane(r.pane).pace,
      variant,
      weightMb: r.record?.weight_bytes ? r.record.weight_bytes / 1e6 : null,
    });
  }

  function drawPane(p) {
    const group = p === "A" || p === "B" ? ["A", "B"] : [p];
    const views = group.map((name) => { const s = pane(name).selected; return s ? viewOfRun(s) : null; });
    const xMax = O.extent(views.filter(Boolean)); // A and B share one time scale
    group.forEach((name, i) => {
      const el = overlayEl(name);
      if (!el || !views[i]) return;
      const t0 = performance.now();
      el.innerHTML = O.all(views[i], { glossary: G, xMax });
      const cost = performance.now() - t0;
      const c = lab.overlayCost;
      c.n += 1; c.total += cost; c.max = Math.max(c.max, cost);
      pane(name).lastCost = cost;
      const foot = document.createElement("div");
      foot.className = "lab-cost";
      foot.title = "Time to build and insert the overlays' SVG on this page (the browser's main thread), averaged over every redraw so far";
      foot.textContent = `overlay redraw ${O.fmtMs(c.total / c.n)} avg · ${O.fmtMs(c.max)} max · ${c.n} redraws`;
      el.appendChild(foot);
      pane(name).lastDraw = performance.now();
    });
  }

  // Live redraws take at most ~10% of the main thread: a redraw that cost c ms waits 10·c ms.
  function scheduleDraw(p) {
    const P = pane(p);
    if (P.draw) return;
    const every = Math.max(DRAW_EVERY_MS, 10 * (P.lastCost || 0));
    const wait = Math.max(0, every - (performance.now() - P.lastDraw));
    P.draw = setTimeout(() => requestAnimationFrame(() => { P.draw = null; drawPane(p); }), wait);
  }

  let ticking = null;
  function ticker() { // keeps the live bars growing while waiting for tokens
    if (ticking) return;
    ticking = setInterval(() => {
      const live = Object.values(lab.panes).filter((P) => P.run && !P.run.finished);
      if (!live.length) { clearInterval(ticking); ticking = null; return; }
      live.forEach((P) => scheduleDraw(P.name));
    }, DRAW_EVERY_MS);
  }

  lab.refreshTable = (p) => refreshTable(p);

  async function refreshTable(p) {
    await ready;
    const el = q(`#lab-table-${p === "B" ? "A" : p} .lab-table-wrap`);
    if (!el) return; // its accordion is closed: it refreshes when opened
    const panes = p === "chat" ? "&pane=chat" : "";
    const r = await fetch(`/lab/table?session=${encodeURIComponent(lab.session)}${panes}`);
    if (r.ok) el.innerHTML = (await r.json()).html;
    document.querySelectorAll("a.lab-export").forEach((a) => {
      const pn = a.dataset.pane ? `?pane=${a.dataset.pane}` : "";
      a.href = `/lab/export/${lab.session}.${a.dataset.fmt}${pn}`;
    });
  }

  // ---- what the buttons call ----------------------------------------------------------------------
  function setInput(selector, text) {
    const ta = q(`${selector} textarea`);
    if (!ta) return;
    ta.value = text;
    ta.dispatchEvent(new Event("input", { bubbles: true }));
  }

  // Chat: [message, ...settings, transport, pace] → returns the new value of the message box.
  lab.sendChat = (args) => {
    const sendAt = pressed();
    const [message, ...rest] = args;
    const P = pane("chat");
    if (!message || !message.trim() || (P.run && !P.run.finished)) return message;
    const settings = settingsOf(rest);
    const transport = rest[CFG.fields.length];
    P.pace = rest[CFG.fields.length + 1] || CFG.readingPace;
    addUser("chat", message);
    run("chat", { message, settings }, sendAt, transport).then((r) => {
      if (r.error) setInput("#lab-msg", message); // nothing typed is lost
    });
    return "";
  };

  lab.regenerate = (p, args) => {
    const sendAt = performance.now();
    const P = pane(p);
    if (P.run && !P.run.finished) return;
    const settings = settingsOf(args);
    const last = logEl(p).querySelector(".lab-msg.assistant:last-child");
    if (last) last.style.display = "none"; // replaced if the new reply comes, shown again if it fails
    run(p, { regenerate: true, settings }, sendAt, args[CFG.fields.length], "regenerated").then((r) => {
      if (!last) return;
      if (r.error) last.style.display = "";
      else last.remove();
    });
  };

  lab.stop = async (p) => {
    const run = pane(p).run;
    if (run && run.smoother && !run.smoother.idle && run.row) drain(run, true); // the reply is in: show it all
    await ready;
    await fetch("/lab/stop", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ session: lab.session, pane: p }) });
  };

  lab.clear = async (p) => {
    await ready;
    await fetch("/lab/clear", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ session: lab.session, pane: p }) });
    const log = logEl(p);
    if (log) log.innerHTML = `<div class="lab-empty">${p === "chat" ? CFG.emptyChat : "This pane's conversation is empty."}</div>`;
    const P = pane(p);
    P.selected = null;
    const ov = overlayEl(p);
    if (ov) ov.innerHTML = `<div class="lab-empty">${CFG.emptyOverlay}</div>`;
  };

  // The A/B tab (ui/compare/ab.js) and the Gradio transport (ui/chat/gradio_transport.js) use these.
  lab.internal = { run, addUser, addAssistant, settingsOf, pressed, busy, pane, errorText, ready, onEvent };
})();
