// A small Markdown renderer that builds DOM nodes: text only ever becomes text nodes (never HTML), so nothing a
// model, a tool or a person writes can add an element, an attribute or a script. Supported: paragraphs (a single
// newline is a line break), headings, **bold**, __bold__, *italic*, _italic_, ~~strike~~, `code`, ``` fenced blocks,
// > quotes, - / * / 1. lists (nested by indentation), --- rules, [links](http…), <http…> and bare http(s) URLs.
// Links are http(s) only; anything else (javascript:, data:, relative) stays text.

const FENCE = /^\s*(`{3,}|~{3,})\s*([\w+#.-]*)\s*$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;
const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;

const INLINE = new RegExp(
  [
    "(`+)([^`]|[^`][\\s\\S]*?[^`])\\1(?!`)", // 1, 2: code
    "\\*\\*(?=\\S)([\\s\\S]*?\\S)\\*\\*", // 3: bold
    "(?<!\\w)__(?=\\S)([\\s\\S]*?\\S)__(?!\\w)", // 4: bold
    "\\*(?=[^\\s*])([\\s\\S]*?[^\\s*])\\*", // 5: italic
    "(?<![\\w])_(?=[^\\s_])([\\s\\S]*?[^\\s_])_(?![\\w])", // 6: italic
    "~~(?=\\S)([\\s\\S]*?\\S)~~", // 7: strike
    "\\[([^\\]\\n]+)\\]\\(\\s*<?([^\\s)>]+)>?\\s*\\)", // 8, 9: link
    "<(https?://[^>\\s]+)>", // 10: autolink
    "(https?://[^\\s<>]*[^\\s<>.,;:!?'\")\\]*_])", // 11: bare URL
  ].join("|"),
  "g",
);

/** The URL itself when it is an absolute http(s) URL, else null. */
export function safeUrl(raw) {
  try {
    const url = new URL(raw);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

function element(tag, text) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  return node;
}

function link(href, label) {
  const a = element("a");
  a.href = href;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  inline(a, label);
  return a;
}

/** Append `text` with its inline Markdown to `parent`. */
export function inline(parent, text) {
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) parent.append(text.slice(last, m.index));
    last = m.index + m[0].length;
    if (m[2] !== undefined) {
      parent.append(element("code", m[2].length > 2 && m[2].startsWith(" ") && m[2].endsWith(" ") ? m[2].slice(1, -1) : m[2]));
    } else if (m[3] !== undefined || m[4] !== undefined) {
      const strong = element("strong");
      inline(strong, m[3] ?? m[4]);
      parent.append(strong);
    } else if (m[5] !== undefined || m[6] !== undefined) {
      const em = element("em");
      inline(em, m[5] ?? m[6]);
      parent.append(em);
    } else if (m[7] !== undefined) {
      const del = element("del");
      inline(del, m[7]);
      parent.append(del);
    } else if (m[8] !== undefined) {
      const href = safeUrl(m[9]);
      if (href) parent.append(link(href, m[8]));
      else parent.append(m[0]);
    } else {
      const raw = m[10] ?? m[11];
      const href = safeUrl(raw);
      parent.append(href ? link(href, raw) : m[0]);
    }
  }
  if (last < text.length) parent.append(text.slice(last));
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || ITEM.test(line) || QUOTE.test(line) || RULE.test(line);
}

function list(lines, i, indent) {
  const first = lines[i].match(ITEM);
  const ordered = /\d/.test(first[2]);
  const node = element(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);
  while (i < lines.length) {
    const m = lines[i].match(ITEM);
    if (m && !RULE.test(lines[i])) {
      const depth = m[1].length;
      if (depth < indent) break;
      if (depth > indent + 1 && node.lastElementChild) {
        const [sub, next] = list(lines, i, depth);
        node.lastElementChild.append(sub);
        i = next;
        continue;
      }
      if (/\d/.test(m[2]) !== ordered) break;
      const li = element("li");
      inline(li, m[3]);
      node.append(li);
      i += 1;
    } else if (lines[i].trim() && /^\s+/.test(lines[i]) && !startsBlock(lines[i]) && node.lastElementChild) {
      node.lastElementChild.append(element("br"));
      inline(node.lastElementChild, lines[i].trim());
      i += 1;
    } else {
      break;
    }
  }
  return [node, i];
}

/** The Markdown `text` as a DocumentFragment. */
export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = String(text ?? "").replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(FENCE);
    if (fence) {
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i += 1; // the closing fence (an answer still streaming may not have it yet)
      const pre = element("pre");
      const code = element("code", body.join("\n"));
      if (fence[2]) code.dataset.lang = fence[2];
      pre.append(code);
      out.append(pre);
    } else if (!line.trim()) {
      i += 1;
    } else if (RULE.test(line)) {
      out.append(element("hr"));
      i += 1;
    } else if (HEADING.test(line)) {
      const m = line.match(HEADING);
      const h = element(`h${Math.min(6, m[1].length + 2)}`);
      inline(h, m[2]);
      out.append(h);
      i += 1;
    } else if (ITEM.test(line)) {
      const [node, next] = list(lines, i, line.match(ITEM)[1].length);
      out.append(node);
      i = next;
    } else if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && QUOTE.test(lines[i])) body.push(lines[i++].match(QUOTE)[1]);
      const quote = element("blockquote");
      quote.append(renderMarkdown(body.join("\n")));
      out.append(quote);
    } else {
      const p = element("p");
      inline(p, line);
      i += 1;
      while (i < lines.length && lines[i].trim() && !startsBlock(lines[i])) {
        p.append(element("br"));
        inline(p, lines[i++]);
      }
      out.append(p);
    }
  }
  return out;
}
