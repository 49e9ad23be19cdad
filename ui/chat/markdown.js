// Latency Lab markdown: a reply's text as DOM nodes, safely, while it streams.
//
// Safety: model output never goes through innerHTML. Every node is made with createElement and
// every piece of model text lands in a Text node (textContent), so `<script>`, `<img onerror>` or
// an `href="javascript:…"` stay inert characters. The renderer knows a small whitelist: paragraphs,
// headings, lists (ordered/unordered, indent kept as a margin), block quotes, rules, fenced code
// blocks, and inline code, **strong** and *emphasis*. Links stay text (no href from model output).
//
// Streaming cost: blocks that are complete (ended by a blank line, or a closed code fence) are
// rendered once and never touched again; each append re-renders only the open tail block. So a
// chunk costs O(tail), not O(reply): the page measures it (a session's renderCost, ui/chat/run.js).

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const HR = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const UL = /^( *)([-*+])\s+(.*)$/;
const OL = /^( *)(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const TABLE_ROW = /^ {0,3}\|.*\|\s*$/; // a GFM table: | a | b |, then | --- | :-: |, then rows
const TABLE_RULE = /^ {0,3}\|(\s*:?-{3,}:?\s*\|)+\s*$/;
// inline: `code`, **strong** / __strong__, *em* / _em_ (underscores only at word edges)
const INLINE = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]*?\S)\*\*|__(?=\S)([\s\S]*?\S)__(?![\w])|\*(?=[^\s*])([^*]*?[^\s*])\*|(?<![\w])_(?=[^\s_])([^_]*?[^\s_])_(?![\w])/g;

function el(doc, tag, cls) {
  const e = doc.createElement(tag);
  if (cls) e.className = cls;
  return e;
}

function inline(doc, parent, text) {
  let at = 0;
  INLINE.lastIndex = 0;
  let m;
  while ((m = INLINE.exec(text))) {
    if (m.index > at) parent.appendChild(doc.createTextNode(text.slice(at, m.index)));
    if (m[1]) {
      const c = el(doc, "code");
      c.textContent = m[2];
      parent.appendChild(c);
    } else if (m[3] != null || m[4] != null) {
      const s = el(doc, "strong");
      inline(doc, s, m[3] != null ? m[3] : m[4]);
      parent.appendChild(s);
      INLINE.lastIndex = m.index + m[0].length; // the recursive call moved it
    } else {
      const e = el(doc, "em");
      inline(doc, e, m[5] != null ? m[5] : m[6]);
      parent.appendChild(e);
      INLINE.lastIndex = m.index + m[0].length;
    }
    at = m.index + m[0].length;
  }
  if (at < text.length) parent.appendChild(doc.createTextNode(text.slice(at)));
}

function cells(line) {
  return line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => c.trim());
}

function table(doc, lines, i) {
  const t = el(doc, "table", "lab-md-table");
  const head = el(doc, "tr");
  for (const c of cells(lines[i])) inline(doc, head.appendChild(el(doc, "th")), c);
  t.appendChild(el(doc, "thead")).appendChild(head);
  const body = t.appendChild(el(doc, "tbody"));
  for (i += 2; i < lines.length && TABLE_ROW.test(lines[i]); i++) {
    const tr = body.appendChild(el(doc, "tr"));
    for (const c of cells(lines[i])) inline(doc, tr.appendChild(el(doc, "td")), c);
  }
  return [t, i];
}

// Lines → block nodes. `lines` are complete or (the last) partial: an unclosed fence renders as
// an open code block, an unclosed ** as literal stars, until the rest arrives.
export function renderBlocks(doc, lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) { i++; continue; }
    if ((m = FENCE.exec(line))) {
      const close = new RegExp("^ {0,3}" + m[1][0] + "{" + m[1].length + ",}\\s*$");
      const body = [];
      i++;
      while (i < lines.length && !close.test(lines[i])) body.push(lines[i++]);
      i++; // the closing fence (if any)
      const pre = el(doc, "pre", "lab-md-code");
      const code = el(doc, "code");
      if (m[2]) code.dataset.lang = m[2];
      code.textContent = body.join("\n");
      pre.appendChild(code);
      out.push(pre);
      continue;
    }
    if ((m = HEADING.exec(line))) {
      const h = el(doc, "h" + Math.min(6, m[1].length + 2), "lab-md-h");
      inline(doc, h, m[2]);
      out.push(h);
      i++;
      continue;
    }
    if (HR.test(line)) { out.push(el(doc, "hr")); i++; continue; }
    if (TABLE_ROW.test(line) && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1])) {
      const [t, next] = table(doc, lines, i);
      out.push(t);
      i = next;
      continue;
    }
    if (UL.test(line) || OL.test(line)) {
      const ordered = !UL.test(line);
      const list = el(doc, ordered ? "ol" : "ul");
      const first = OL.exec(line);
      if (ordered && first && first[2] !== "1") list.start = parseInt(first[2], 10);
      let item = null;
      while (i < lines.length && lines[i].trim()) {
        const l = lines[i];
        const um = UL.exec(l), om = OL.exec(l);
        const mm = ordered ? om : um;
        if (mm) {
          item = el(doc, "li");
          const indent = Math.min(mm[1].length, 12);
          if (indent >= 2) item.style.marginLeft = indent / 2 + "em";
          inline(doc, item, mm[3]);
          list.appendChild(item);
        } else if ((ordered ? um : om) || FENCE.test(l) || HEADING.test(l)) {
          break; // another kind of block starts
        } else {
          inline(doc, item, "\n" + l.trim()); // a continuation line of the item
        }
        i++;
      }
      out.push(list);
      continue;
    }
    if (QUOTE.test(line)) {
      const q = el(doc, "blockquote");
      const body = [];
      while (i < lines.length && (m = QUOTE.exec(lines[i]))) { body.push(m[1]); i++; }
      inline(doc, q, body.join("\n"));
      out.push(q);
      continue;
    }
    const para = [];
    while (i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) && !HEADING.test(lines[i]) &&
           !(para.length && (UL.test(lines[i]) || OL.test(lines[i]) || QUOTE.test(lines[i]) || HR.test(lines[i])))) {
      para.push(lines[i++]);
    }
    const p = el(doc, "p");
    inline(doc, p, para.join("\n"));
    out.push(p);
  }
  return out;
}

// The end of the complete blocks in src[from:]: after a blank line outside a fence, or after a
// fence's closing line. Returns the index where the open tail begins.
export function frozenEnd(src, from) {
  let end = from, at = from, fence = null;
  for (;;) {
    const nl = src.indexOf("\n", at);
    if (nl < 0) return end; // the last line is partial: it belongs to the tail
    const line = src.slice(at, nl);
    if (fence) {
      if (fence.test(line)) { fence = null; end = nl + 1; }
    } else {
      const m = FENCE.exec(line);
      if (m) fence = new RegExp("^ {0,3}" + m[1][0] + "{" + m[1].length + ",}\\s*$");
      else if (!line.trim()) end = nl + 1;
    }
    at = nl + 1;
  }
}

export class Renderer {
  constructor(container) {
    this.el = container;
    this.doc = container.ownerDocument;
    this.data = ""; // the raw text, as a Text node's .data would hold it
    this.frozen = 0; // src[0:frozen] is rendered for good
    this.tail = []; // the nodes of the open tail
    this.last = { markdown: 0, dom: 0 }; // the last append's cost, ms: parsing into detached nodes vs the page's DOM
  }

  appendData(text) {
    if (!text) return;
    this.data += text;
    this.render();
  }

  render() {
    const t0 = performance.now();
    const end = frozenEnd(this.data, this.frozen);
    const frozen = end > this.frozen ? renderBlocks(this.doc, this.data.slice(this.frozen, end).split("\n")) : [];
    this.frozen = Math.max(this.frozen, end);
    const rest = this.data.slice(this.frozen);
    const tail = rest ? renderBlocks(this.doc, rest.split("\n")) : [];
    const t1 = performance.now();
    for (const n of this.tail) n.remove();
    for (const n of frozen) this.el.appendChild(n);
    for (const n of tail) this.el.appendChild(n);
    this.tail = tail;
    this.last = { markdown: t1 - t0, dom: performance.now() - t1 };
  }
}

export function render(container, text) {
  const r = new Renderer(container);
  r.appendData(text);
  return r;
}
