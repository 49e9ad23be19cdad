// A pane's transcript in the page: the user's messages, the assistant's bubbles (markdown as DOM
// nodes, model text only through textContent: ui/chat/markdown.js) and their status line.
import { Renderer } from "./markdown.js";

const q = (sel) => document.querySelector(sel);
export const logEl = (p) => q(`#lab-log-${p} .lab-log`);
export const overlayEl = (p) => q(`#lab-ov-${p} .lab-ov`);

function scrollDown(p) {
  const log = logEl(p);
  if (log) log.scrollTop = log.scrollHeight;
}

// Once per frame, not per chunk: reading scrollHeight forces a layout, and a layout per chunk
// is what made long fast replies fall behind.
const scrollPending = new Set();
export function scrollSoon(p) {
  if (scrollPending.has(p)) return;
  scrollPending.add(p);
  requestAnimationFrame(() => { scrollPending.delete(p); scrollDown(p); });
}

export function addUser(p, text, note) {
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

// markdown: render the reply's markdown (else one plain Text node)
export function addAssistant(p, label, markdown) {
  const log = logEl(p);
  log.querySelector(".lab-empty")?.remove();
  const el = document.createElement("div");
  el.className = "lab-msg assistant";
  el.innerHTML = `<div class="lab-meta"></div><div class="lab-bubble"><div class="lab-text lab-md"></div><span class="lab-status">sending…</span></div><div class="lab-stats"></div><div class="lab-perceived"></div><div class="lab-what"></div>`;
  el.querySelector(".lab-meta").textContent = label || "";
  const box = el.querySelector(".lab-text");
  const text = markdown ? new Renderer(box) : box.appendChild(document.createTextNode(""));
  log.appendChild(el);
  scrollDown(p);
  return { el, text, status: el.querySelector(".lab-status") };
}

export function setStatus(run, text) {
  run.view.status.textContent = text || "";
  run.view.status.className = "lab-status";
  run.view.status.style.display = text ? "" : "none";
}

// Chunked prefill reports prompt tokens processed / total: a progress bar instead of a frozen wait.
export function setProgress(run, done, total, t) {
  const pct = Math.max(0, Math.min(100, (100 * done) / total));
  const el = run.view.status;
  el.className = "lab-status lab-progressing";
  el.style.display = "";
  el.innerHTML = `<span class="lab-progress" role="progressbar" aria-valuemin="0" aria-valuemax="${total}" aria-valuenow="${done}"><span class="lab-progress-bar" style="width:${pct.toFixed(1)}%"></span></span> processing the prompt: ${done.toLocaleString("en-US")} / ${total.toLocaleString("en-US")} tokens`;
  run.progress.push([t - run.sendAt, done, total]);
}

export function emptyPane(p, text) {
  const log = logEl(p);
  if (log) log.innerHTML = `<div class="lab-empty">${text}</div>`;
}

export function emptyOverlay(p, text) {
  const ov = overlayEl(p);
  if (ov) ov.innerHTML = `<div class="lab-empty">${text}</div>`;
}
