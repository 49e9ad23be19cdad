// The page's one entry module (loaded by ui/page.py's <head> as <script type="module">): it makes the
// tab's session, lists what goes under a finished reply, and wires Gradio's buttons to the features'
// modules. Gradio's `js` handlers (ui/chat/tab.py, ui/compare/tab.py, ui/load/tab.py) and the tests
// reach the page through `window.lab`, which only this module writes; every other module imports
// what it uses and is handed the session.
import * as chat from "./chat/actions.js";
import { onGradioUpdate, takeGradioPayload } from "./chat/gradio_transport.js";
import { Session } from "./chat/session.js";
import { stressRun } from "./chat/stress.js";
import { refreshTable } from "./chat/table.js";
import { runAB, runPreset, stopAB } from "./compare/ab.js";
import { addReplay } from "./insight/replay.js";
import { addWhatIf } from "./insight/whatif.js";
import { closedLoop } from "./load/load.js";
import { openLoop } from "./load/open_loop.js";
import { CFG } from "./shell/config.js";
import { wireRemeasure } from "./shell/header.js";
import { attach as traceLink } from "./trace/trace.js";

const session = new Session(CFG);
session.afterReply.push(traceLink, addReplay, addWhatIf); // under a finished reply: Trace, the replay, the what-if
chat.watchSend(session);
wireRemeasure();

window.LAB_CONFIG = CFG;
window.lab = {
  get session() { return session.id; },
  panes: session.panes,
  clock: session.clock,
  overlayCost: session.overlayCost,
  renderCost: session.renderCost,
  get markdown() { return session.markdown; },
  set markdown(on) { session.markdown = on; }, // ui/bench.py compares markdown and plain text
  // the Chat tab
  sendChat: (args) => chat.sendChat(session, args),
  regenerate: (p, args) => chat.regenerate(session, p, args),
  stop: (p) => chat.stop(session, p),
  clear: (p) => chat.clear(session, p),
  refreshTable: (p) => refreshTable(session, p),
  stress: (rates) => stressRun(session, rates), // this browser's paint limit (the Chat tab's stress run)
  get stressResult() { return session.stress || null; },
  takeGradioPayload,
  onGradioUpdate,
  // the A/B tab
  runAB: (args) => runAB(session, args),
  runPreset: (name, args) => runPreset(session, name, args),
  stopAB: () => stopAB(session),
  // the Load tab
  load: closedLoop(session),
  openLoop: openLoop(CFG),
};
