// Latency Lab: the what-if under a chat reply. Predict its TTFT/TPOT for a prompt N× as long,
// another weights variant or a batch size (/lab/whatif, engine/measure/whatif.py); "Run it" sends
// that prompt with those weights through the same pane and settings, then shows predicted vs
// measured and the error (/lab/whatif/check).
import { run } from "../chat/run.js";
import { addUser } from "../chat/transcript.js";
import { getJSON } from "../shell/http.js";

// An after-reply hook: under a chat reply, the what-if's inputs and its buttons.
export function addWhatIf(session, r) {
  if (r.pane !== "chat" || !r.requestId || r.error || !r.record) return;
  const box = document.createElement("div");
  box.className = "lab-whatif";
  box.innerHTML = `<span title="${(session.cfg.glossary.whatif_ttft_ms || {}).hover || ""}">What if:</span>
    prompt × <input class="lab-whatif-factor" type="number" min="0.1" max="64" step="0.5" value="4" style="width:4em">
    weights <input class="lab-whatif-variant" type="text" placeholder="same" style="width:7em">
    batch <input class="lab-whatif-batch" type="number" min="1" max="256" step="1" value="1" style="width:4em">
    <button type="button" class="lab-linkbtn lab-whatif-predict">predict</button>
    <button type="button" class="lab-linkbtn lab-whatif-run" title="send that prompt with those weights through this pane, same settings">run it</button>
    <div class="lab-whatif-out"></div><div class="lab-whatif-result"></div>`;
  r.view.el.appendChild(box);
  const val = (cls) => box.querySelector(cls).value;
  const query = () => {
    const f = Number(val(".lab-whatif-factor")) || 1, v = val(".lab-whatif-variant").trim(), b = Number(val(".lab-whatif-batch")) || 1;
    return { f, v, b, qs: `session=${encodeURIComponent(session.id)}&factor=${f}&variant=${encodeURIComponent(v)}&batch=${b}` };
  };
  const out = box.querySelector(".lab-whatif-out"), result = box.querySelector(".lab-whatif-result");
  let last = null;
  const predict = async () => {
    const q = query();
    try {
      last = await getJSON(`/lab/whatif?request_id=${encodeURIComponent(r.requestId)}&${q.qs}`);
      out.innerHTML = last.html;
    } catch (e) { out.textContent = e.message; last = null; }
    return q;
  };
  box.querySelector(".lab-whatif-predict").addEventListener("click", predict);
  box.querySelector(".lab-whatif-run").addEventListener("click", async () => {
    if (session.busy()) return;
    const q = await predict();
    if (!last) return;
    if (q.b !== 1) { result.textContent = "A batch runs from the Load tab (max batch per run); the prediction above is for its TPOT."; return; }
    await session.ready;
    const message = last.message || r.record.prompt;
    const settings = Object.assign({}, r.record.settings, q.v ? { quantization: q.v } : {});
    addUser("chat", message);
    const m = await run(session, "chat", { message, settings }, performance.now(), r.transport, `what-if of reply ${r.requestId}`);
    if (m.error || !m.requestId) { result.textContent = m.error || "the what-if reply did not run"; return; }
    try {
      const c = await getJSON(`/lab/whatif/check?session=${encodeURIComponent(session.id)}&base=${encodeURIComponent(r.requestId)}&measured=${encodeURIComponent(m.requestId)}&variant=${encodeURIComponent(q.v)}&batch=1`);
      result.innerHTML = c.html;
      m.view.el.appendChild(result.cloneNode(true)); // beside the reply that measured it, too
    } catch (e) { result.textContent = e.message; }
  });
}
