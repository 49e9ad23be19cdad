// Latency Lab A/B tab: one prompt through pane A, then pane B, then the delta table; the teaching
// presets (a seeded history, then their turns). Runs go through page.js's `run` (lab.internal).
(function () {
  "use strict";
  const CFG = window.LAB_CONFIG;
  const lab = window.lab;
  const { run, addUser, addAssistant, settingsOf, pressed, busy, pane, errorText, ready } = lab.internal;
  const q = (sel) => document.querySelector(sel);

  // A/B: the same prompt through A, then B; overlays on one time scale; then the delta table.
  async function abTurn(prompt, sA, sB, transport, pressedAt) {
    const sendA = pressedAt ?? performance.now();
    addUser("A", prompt);
    const a = await run("A", { message: prompt, settings: sA }, sendA, transport, "A");
    const sendB = performance.now();
    addUser("B", prompt);
    const b = await run("B", { message: prompt, settings: sB }, sendB, transport, "B");
    return [a, b];
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
    abStatus("running A, then B…");
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
      abStatus(`${preset.title}: turn ${i + 1} of ${preset.turns.length}, A then B…`);
      pair = await abTurn(preset.turns[i], sA, sB, transport);
      if (pair[0].error || pair[1].error) break;
    }
    abStatus("");
    if (pair) await showDelta(pair[0], pair[1]);
  };

  lab.stopAB = () => Promise.all([lab.stop("A"), lab.stop("B")]);
})();
