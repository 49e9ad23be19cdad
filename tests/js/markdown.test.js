// ui/chat/markdown.js in Node with a minimal fake DOM: what it renders, that streamed text renders the
// same as the whole text at once, and that model HTML only ever becomes text.
import assert from "node:assert";
import test from "node:test";

import { frozenEnd, Renderer } from "../../ui/chat/markdown.js";

class Node {
  constructor(tag, text) { this.tag = tag; this.text = text; this.children = []; this.parent = null; this.className = ""; this.dataset = {}; this.style = {}; this.ownerDocument = doc; }
  appendChild(c) { c.parent = this; this.children.push(c); return c; }
  remove() { if (this.parent) this.parent.children = this.parent.children.filter((c) => c !== this); this.parent = null; }
  set textContent(t) { this.children = [doc.createTextNode(t)]; }
  get html() { // a serialization that escapes text, as the DOM would
    if (this.tag === "#text") return this.text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
    const attrs = (this.className ? ` class="${this.className}"` : "") + (this.start ? ` start="${this.start}"` : "") +
      (this.dataset.lang ? ` data-lang="${this.dataset.lang}"` : "") + (this.style.marginLeft ? ` style="margin-left:${this.style.marginLeft}"` : "");
    return `<${this.tag}${attrs}>${this.children.map((c) => c.html).join("")}</${this.tag}>`;
  }
}
const doc = { createElement: (t) => new Node(t), createTextNode: (t) => new Node("#text", t) };
const render = (text) => { const box = new Node("div"); new Renderer(box).appendData(text); return box.html; };
const streamed = (text, step) => {
  const box = new Node("div"), r = new Renderer(box);
  for (let i = 0; i < text.length; i += step) r.appendData(text.slice(i, i + step));
  return box.html;
};

const SAMPLE = "# Title\n\nSome **bold**, *em*, _em2_ and `a < b`.\nNext line.\n\n- one\n- two **x**\n  - nested\n\n3. three\n4. four\n\n" +
  "```js\nif (a < b) { x = '<b>'; }\n\n// blank line above stays in the block\n```\n\n> quoted *text*\n\n---\n\nsnake_case_name stays";

test("blocks and inline marks", () => {
  const html = render(SAMPLE);
  assert.match(html, /<h3 class="lab-md-h">Title<\/h3>/);
  assert.match(html, /<p>Some <strong>bold<\/strong>, <em>em<\/em>, <em>em2<\/em> and <code>a &lt; b<\/code>.\nNext line.<\/p>/);
  assert.match(html, /<ul><li>one<\/li><li>two <strong>x<\/strong><\/li><li style="margin-left:1em">nested<\/li><\/ul>/);
  assert.match(html, /<ol start="3"><li>three<\/li><li>four<\/li><\/ol>/);
  assert.match(html, /<pre class="lab-md-code"><code data-lang="js">if \(a &lt; b\) \{ x = '&lt;b&gt;'; \}\n\n\/\/ blank line above stays in the block<\/code><\/pre>/);
  assert.match(html, /<blockquote>quoted <em>text<\/em><\/blockquote><hr><\/hr><p>snake_case_name stays<\/p>/);
});

test("streamed in any chunk size renders as the whole text", () => {
  const whole = render(SAMPLE);
  for (const step of [1, 2, 3, 7, 16, 100]) assert.strictEqual(streamed(SAMPLE, step), whole, `step ${step}`);
});

test("model HTML is text, never markup", () => {
  const html = render("<script>alert(1)</script> **<img src=x onerror=alert(2)>**\n\n`<b>`");
  assert.ok(!/<script|<img|<b>/.test(html), html);
  assert.match(html, /&lt;script&gt;alert\(1\)&lt;\/script&gt; <strong>&lt;img src=x onerror=alert\(2\)&gt;<\/strong>/);
});

test("complete blocks freeze; an open fence keeps the tail open", () => {
  assert.strictEqual(frozenEnd("a\n\nb", 0), 3);
  assert.strictEqual(frozenEnd("```\ncode\n\nmore", 0), 0);
  assert.strictEqual(frozenEnd("```\ncode\n```\nx", 0), 13);
  assert.strictEqual(render("**open"), "<div><p>**open</p></div>"); // unclosed marks stay literal
});

test("a GFM table renders as a table; a header line alone stays a paragraph until its rule arrives", () => {
  const html = render("| a | b |\n|---|---|\n| 1 | **2** |\n\nafter");
  assert.match(html, /<table class="lab-md-table"><thead><tr><th>a<\/th><th>b<\/th><\/tr><\/thead><tbody><tr><td>1<\/td><td><strong>2<\/strong><\/td><\/tr><\/tbody><\/table><p>after<\/p>/);
  assert.match(render("| a | b |"), /<p>\| a \| b \|<\/p>/);
});

test("render work per update does not grow with the reply (nodes made per append, late vs early)", () => {
  const section = (k) => `## Part ${k}\n\nSome **text** of part ${k}.\n\n- one\n- two\n\n\`\`\`py\nfor x in range(${k}):\n    y += x\n\`\`\`\n\n| a | b |\n|---|---|\n| ${k} | 2 |\n\n`;
  let text = "";
  for (let k = 1; text.length < 15000; k++) text += section(k);
  const pieces = text.match(/\s*\S+/g);
  let made = 0;
  const counting = { createElement: (t) => { made++; return doc.createElement(t); }, createTextNode: (t) => { made++; return doc.createTextNode(t); } };
  const box = new Node("div");
  box.ownerDocument = counting;
  const r = new Renderer(box), per = [];
  for (const p of pieces) { made = 0; r.appendData(p); per.push(made); }
  const q = Math.floor(per.length / 4), mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const ratio = mean(per.slice(-q)) / mean(per.slice(0, q));
  assert.ok(ratio < 1.5, `late updates make ${ratio.toFixed(2)}x the nodes of early ones`);
});
