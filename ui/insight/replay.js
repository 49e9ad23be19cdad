// Latency Lab: a speculative reply replayed under its bubble (the block comes back with the reply's
// turn, POST /lab/turn: ui/insight/replay.py, routes.py `replay_part`). Accepted drafts, rejected drafts and the target's own tokens are told apart;
// hover a token for its step and draft position; the slider replays the reply step by step.
const style = document.createElement("style");
style.textContent = `
  .lab-replay { margin: 6px 0 4px; font-size: 13px; }
  .lab-replay-tokens { white-space: pre-wrap; line-height: 1.7; padding: 6px; border: 1px solid #e2e8f0; border-radius: 6px; }
  .lab-tok-acc { background: #bbf7d0; border-radius: 3px; }
  .lab-tok-rej { background: #fecaca; color: #991b1b; border-radius: 3px; }
  .lab-tok-own { background: #e0e7ff; border-radius: 3px; }
  .lab-replay [data-step].lab-now { outline: 2px solid #f59e0b; }
  .lab-replay [data-step].lab-later { display: none; }
  .lab-replay-ctl { margin-left: 10px; }
  .lab-spec-warning { color: #b45309; font-weight: 600; margin: 4px 0; }`;
document.head.appendChild(style);

// Show the reply up to step `at`; outline that step's tokens (accepted, rejected and the target's).
function showStep(box, at) {
  const last = Number(box.dataset.lastStep);
  box.querySelectorAll("[data-step]").forEach((el) => {
    const s = Number(el.dataset.step);
    el.classList.toggle("lab-later", s > at);
    el.classList.toggle("lab-now", s === at && at < last);
  });
  box.querySelector(".lab-replay-at").textContent = `${at} of ${last}`;
}

// An after-reply hook: the block under a speculative reply (none without speculation).
export function addReplay(session, r) {
  const html = r.turn && r.turn.replay_html;
  if (!r.requestId || !html) return;
  const holder = document.createElement("div");
  holder.innerHTML = html;
  r.view.el.appendChild(holder);
  const box = holder.querySelector(".lab-replay");
  const slider = box && box.querySelector(".lab-replay-step");
  if (slider) slider.addEventListener("input", () => showStep(box, Number(slider.value)));
}
