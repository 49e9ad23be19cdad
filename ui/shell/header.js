// The header's live parts: the clock offset line (with its ± bound) and the machine limits'
// "re-measure" button (a 1–2 s probe on the server, then the new figures).
import { fmtMs } from "./format.js";

const CLOCK_HOVER = "Server and browser clocks are aligned NTP-style: several pings to the server, keeping the one with " +
  "the shortest round trip; the bound is half that round trip. Only cross-clock figures (network in/out) use it.";

// clock: {offset, bound} (ui/chat/client_timing.js Clock)
export function showClock(clock) {
  const el = document.getElementById("lab-clock");
  if (!el) return;
  el.textContent = clock.offset == null ? "clock offset: unknown" : `clock offset ±${fmtMs(clock.bound)}`;
  el.title = CLOCK_HOVER;
}

async function remeasure(button) {
  const line = document.getElementById("lab-limits");
  button.disabled = true;
  const old = button.textContent;
  button.textContent = "measuring…";
  try {
    const r = await fetch("/lab/limits", { method: "POST" });
    const j = await r.json();
    if (line) line.textContent = r.ok ? j.line : (j.detail && j.detail.message) || "could not measure";
  } catch (e) {
    if (line) line.textContent = "could not measure: " + e;
  } finally {
    button.disabled = false;
    button.textContent = old;
  }
}

export function wireRemeasure() {
  document.addEventListener("click", (e) => {
    const b = e.target.closest && e.target.closest("#lab-limits-rerun");
    if (b && !b.disabled) remeasure(b);
  });
}
