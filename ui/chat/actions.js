// What the Chat tab's buttons call (the entry module hands them the controls' values): send,
// regenerate, stop, clear; and reading a pane's settings from its controls' values.
import { postJSON } from "../shell/http.js";
import { drain, run } from "./run.js";
import { addUser, emptyOverlay, emptyPane, logEl } from "./transcript.js";

// "User pressed send" is the DOM event itself (click, or Enter in the message box), stamped in the
// capture phase before Gradio dispatches its handler to us.
const SEND_BUTTONS = "#lab-send, #lab-ab-run";
const SEND_BOXES = "#lab-msg textarea, #lab-ab-msg textarea";

export function watchSend(session) {
  document.addEventListener("click", (e) => { if (e.target.closest?.(SEND_BUTTONS)) session.pressedAt = performance.now(); }, true);
  document.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && e.target.matches?.(SEND_BOXES)) session.pressedAt = performance.now();
  }, true);
}

export function pressed(session) {
  const now = performance.now();
  const t = session.pressedAt != null && now - session.pressedAt < 1000 ? session.pressedAt : now;
  session.pressedAt = null;
  return t;
}

// A pane's controls' values, in the order of the config's `fields` → {name: value}.
export function settingsOf(fields, values) {
  const s = {};
  fields.forEach((name, i) => { s[name] = values[i]; });
  if (s.seed === "" || s.seed == null) s.seed = null;
  return s;
}

function setInput(selector, text) {
  const ta = document.querySelector(`${selector} textarea`);
  if (!ta) return;
  ta.value = text;
  ta.dispatchEvent(new Event("input", { bubbles: true }));
}

// Chat: [message, ...settings, transport, pace] → returns the new value of the message box.
export function sendChat(session, args) {
  const sendAt = pressed(session);
  const fields = session.cfg.fields;
  const [message, ...rest] = args;
  const P = session.pane("chat");
  if (!message || !message.trim() || (P.run && !P.run.finished)) return message;
  const settings = settingsOf(fields, rest);
  const transport = rest[fields.length];
  P.pace = rest[fields.length + 1] || session.cfg.readingPace;
  addUser("chat", message);
  run(session, "chat", { message, settings }, sendAt, transport).then((r) => {
    if (r.error) setInput("#lab-msg", message); // nothing typed is lost
  });
  return "";
}

export function regenerate(session, p, args) {
  const sendAt = performance.now();
  const P = session.pane(p);
  if (P.run && !P.run.finished) return;
  const fields = session.cfg.fields;
  const last = logEl(p).querySelector(".lab-msg.assistant:last-child");
  if (last) last.style.display = "none"; // replaced if the new reply comes, shown again if it fails
  run(session, p, { regenerate: true, settings: settingsOf(fields, args) }, sendAt, args[fields.length], "regenerated").then((r) => {
    if (!last) return;
    if (r.error) last.style.display = "";
    else last.remove();
  });
}

export async function stop(session, p) {
  const r = session.pane(p).run;
  if (r && r.smoother && !r.smoother.idle && r.row) drain(session, r, true); // the reply is in: show it all
  await session.ready;
  await postJSON("/lab/stop", { session: session.id, pane: p });
}

export async function clear(session, p) {
  await session.ready;
  await postJSON("/lab/clear", { session: session.id, pane: p });
  emptyPane(p, p === "chat" ? session.cfg.emptyChat : "This pane's conversation is empty.");
  session.pane(p).selected = null;
  emptyOverlay(p, session.cfg.emptyOverlay);
}
