// The table of a tab's replies ("Replies in this tab"), rendered by the server, and its export links.
const q = (sel) => document.querySelector(sel);

// The chat's table, or the A/B tab's (both panes).
const wrapOf = (p) => q(`#lab-table-${p === "B" ? "A" : p} .lab-table-wrap`);

// Whether the page shows the table now (a closed accordion's content is not in the page).
export const tableShown = (p) => !!wrapOf(p);

export function showTable(session, p, html) {
  const el = wrapOf(p);
  if (!el) return; // its accordion is closed: it refreshes when opened
  el.innerHTML = html;
  document.querySelectorAll("a.lab-export").forEach((a) => {
    const pn = a.dataset.pane ? `?pane=${a.dataset.pane}` : "";
    a.href = `/lab/export/${session.id}.${a.dataset.fmt}${pn}`;
  });
}

export async function refreshTable(session, p) {
  await session.ready;
  if (!wrapOf(p)) return;
  const panes = p === "chat" ? "&pane=chat" : "";
  const r = await fetch(`/lab/table?session=${encodeURIComponent(session.id)}${panes}`);
  if (r.ok) showTable(session, p, (await r.json()).html);
}
