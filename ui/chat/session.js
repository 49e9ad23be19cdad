// A browser tab's session: its id on the server (POST /lab/session: the server's one session registry),
// its clock offset, its panes with their runs, and what the page measures of itself. Every chat module
// takes it as an argument; nothing reads it from a global (the entry module, ui/entry.js, creates one).
import { showClock } from "../shell/header.js";
import { Clock } from "./client_timing.js";

const SYNC_CHECK_MS = 5000; // how often the idle page looks at its clock estimate's age
const SYNC_AFTER_MS = 30000; // pings again when the sample behind the offset is older than this

export class Session {
  constructor(cfg) {
    this.cfg = cfg;
    this.id = null;
    this.clock = new Clock();
    this.panes = {}; // "chat", "A", "B": {name, runs, run, selected, pace, draw, lastDraw, lastCost}
    this.overlayCost = { n: 0, total: 0, max: 0 }; // ms of main thread per overlay redraw
    this.renderCost = { n: 0, total: 0, max: 0 }; // ms of main thread per text update (markdown or plain)
    this.markdown = cfg.markdown !== false;
    this.pressedAt = null; // the send button's click (or Enter), stamped before Gradio hands it over
    this.afterReply = []; // (session, run): what a finished reply gets under it (ui/entry.js lists them)
    this.ready = this.start();
  }

  async start() {
    const r = await fetch("/lab/session", { method: "POST" });
    this.id = (await r.json()).session;
    await this.clock.sync(5).catch(() => null);
    showClock(this.clock);
    // Fresh pings keep the offset's bound tight while the page is idle. A turn's own request is a
    // sample too (ui/chat/run.js), so a page in use seldom pings.
    setInterval(() => {
      const age = this.clock.bestAt == null ? Infinity : performance.now() - this.clock.bestAt;
      if (!this.busy() && age > SYNC_AFTER_MS) this.clock.sync(3).then(() => showClock(this.clock)).catch(() => null);
    }, SYNC_CHECK_MS);
    return this.id;
  }

  pane(name) {
    return (this.panes[name] ||= { name, runs: [], run: null, selected: null, pace: this.cfg.readingPace, draw: null, lastDraw: 0 });
  }

  busy() { return Object.values(this.panes).some((p) => p.run && !p.run.finished); }
}
