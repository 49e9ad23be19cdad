// Latency Lab A/B tab: one prompt through panes A and B (which runs first alternates), then the delta table; the teaching
// presets (a seeded history, then their turns). Runs go through page.js's `run` (lab.internal).
(function () {
  "use strict";
  const CFG = window.LAB_CONFIG;
  const lab = window.lab;
  const { run, addUser, addAssistant, settingsOf, pressed, busy, pane, errorText, ready } = lab.internal;
  const q = (sel) => document.querySelector(sel);

  // Which pane runs first alternates per prompt and settings (CFG.abOrder, ABBA, after CFG.abWarmup
  // warm-up pairs run A first), so what a pair's first run warms up helps A and B alike; the server reads
  // each pair's order from its own stamps (ui/compare/repeated.py).
  const pairsRun = new Map(); // [prompt, A's settings, B's settings] → pairs run so far in this tab

  function order(prompt, sA, sB) {
    const key = JSON.stringify([prompt, sA, sB]);
    const k = pairsRun.get(key) || 0;
    pairsRun.set(key, k + 1);
    return k < CFG.abWarmup ? "AB" : CFG.abOrder[(k - CFG.abWarmup) % CFG.abOrder.length];
  }

  // A/B: the same prompt through both panes, one after the other; overlays on one time scale; then the delta table.
  async function abTurn(prompt, sA, sB, transport, pressedAt, what = "") {
    const first = order(prompt, sA, sB);
    const settings = { A: sA, B: sB }, out = {};
    let sendAt = pressedAt ?? performance.now();
    abStatus(`${what}running ${first[0]}, then ${first[1]}…`);
    for (const [i, p] of [...first].entries()) {
      addUser(p, prompt);
      out[p] = await run(p, { message: prompt, settings: settings[p] }, sendAt, transport, `${p} · ran ${i ? "second" : "first"}`);
      sendAt = performance.now();
    }
    return [out.A, out.B];
  }

  async function showDelta(a, b) {
    const el = q("#lab-delta .lab-delta-wrap");
    if (!el) return;
    if (!a.requestId || !b.requestId || a.error || b.error) {
      el.innerHTML = `<div class="lab-muted">${a.error || b.error || "no pair to compare"}</div>`;
      return;
    }
    const r = await fetch(`/lab/delta?session=${encodeURIComponent(lab.session)}&a=${a.requestId}&b=${b.requestId}`);
    el.innerHTML = r.ok ? (await r.json()).html : await errorText(r);
  }

  function abStatus(text) { const el = q("#lab-ab-status"); if (el) el.textContent = text; }

  lab.runAB = (args) => {
    const pressedAt = pressed();
    const [prompt, ...rest] = args;
    const n = CFG.fields.length;
    if (!prompt || !prompt.trim() || busy()) return prompt;
    const sA = settingsOf(rest.slice(0, n)), sB = settingsOf(rest.slice(n, 2 * n));
    const transport = rest[2 * n];
    pane("A").pace = pane("B").pace = rest[2 * n + 1] || CFG.readingPace;
    abTurn(prompt, sA, sB, transport, pressedAt).then(([a, b]) => { abStatus(""); return showDelta(a, b); });
    return "";
  };

  lab.runPreset = async (name, args) => {
    const preset = CFG.presets[name];
    if (!preset || !preset.available || busy()) return; // the note under the buttons says why
    const n = CFG.fields.length;
    const sA = settingsOf(args.slice(0, n)), sB = settingsOf(args.slice(n, 2 * n));
    const transport = args[2 * n];
    await ready;
    for (const p of ["A", "B"]) {
      await lab.clear(p);
      const r = await fetch("/lab/seed", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ session: lab.session, pane: p, preset: name }) });
      if (!r.ok) { abStatus(await errorText(r)); return; }
      for (const m of (await r.json()).messages) {
        if (m.role === "user") addUser(p, m.content, true);
        else { const v = addAssistant(p, "preset history"); v.text.appendData(m.content); v.status.style.display = "none"; v.el.classList.add("seeded"); }
      }
    }
    let pair = null;
    for (let i = 0; i < preset.turns.length; i++) {
      pair = await abTurn(preset.turns[i], sA, sB, transport, undefined, `${preset.title}: turn ${i + 1} of ${preset.turns.length}, `);
      if (pair[0].error || pair[1].error) break;
    }
    abStatus("");
    if (pair) await showDelta(pair[0], pair[1]);
  };

  lab.stopAB = () => Promise.all([lab.stop("A"), lab.stop("B")]);
})();
