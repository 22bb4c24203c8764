// specdec play: the page's only script. It asks the server (specdec.play.app) for a traced run, a
// comparison or a probe, and draws what comes back. No library and no network beyond this server.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { info: null, run: null, runKey: null, shown: 0, selected: 0, busy: false };

// --- talking to the server -----------------------------------------------------------------------

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
  let response;
  try {
    response = await fetch(path, options);
  } catch (error) {
    throw new Error(`the server did not answer (${error.message}); is specdec play still running?`);
  }
  let data = null;
  try { data = await response.json(); } catch (error) { data = null; }
  if (!response.ok) {
    const message = data && data.error ? data.error : response.statusText;
    throw new Error(`${response.status}: ${message}`);
  }
  return data;
}

function showError(error) {
  const box = $("error");
  box.textContent = error ? String(error.message || error) : "";
  box.hidden = !error;
}

async function busy(label, work) {
  if (state.busy) return;
  state.busy = true;
  document.body.dataset.busy = "true";
  document.querySelectorAll("button:not(.tab)").forEach((b) => { b.disabled = true; });
  $("status").textContent = label;
  try {
    await work();
    showError(null);
  } catch (error) {
    showError(error);
    $("status").textContent = "";
  } finally {
    state.busy = false;
    document.querySelectorAll("button:not(.tab)").forEach((b) => { b.disabled = false; });
    document.body.dataset.busy = "false";
  }
}

// --- controls ------------------------------------------------------------------------------------

function settings() {
  return {
    prompt: $("prompt").value,
    drafter: $("drafter").value,
    k: Number($("k").value),
    draft_length: $("k-auto").checked ? "auto" : "fixed",
    shape: document.querySelector("input[name=shape]:checked").value,
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
    max_new_tokens: Number($("max-new-tokens").value),
    seed: Number($("seed").value),
  };
}

function syncOutputs() {
  $("k-value").textContent = $("k").value;
  $("temperature-value").textContent = $("temperature").value;
  $("top-p-value").textContent = $("top-p").value;
  const choice = (state.info ? state.info.drafters : []).find((d) => d.name === $("drafter").value);
  const tree = document.querySelector("input[name=shape][value=tree]");
  tree.disabled = !choice || !choice.tree;
  if (tree.disabled && tree.checked) document.querySelector("input[name=shape][value=chain]").checked = true;
}

async function loadInfo() {
  const info = await api("/api/info");
  state.info = info;
  $("model").textContent = `${info.title}: ${info.model}, vocabulary ${info.vocab_size}`;
  const select = $("drafter");
  select.textContent = "";
  for (const d of info.drafters) {
    const option = document.createElement("option");
    option.value = d.name;
    option.textContent = d.available ? d.name + (d.tree ? "  (chain or tree)" : "") : `${d.name}  (unavailable)`;
    option.disabled = !d.available;
    if (!d.available) option.title = d.reason;
    select.appendChild(option);
  }
  const defaults = info.defaults;
  const firstDrafter = info.drafters.find((d) => d.available && d.name !== "plain");
  select.value = info.drafters.some((d) => d.name === defaults.drafter && d.available) ? defaults.drafter
    : (firstDrafter ? firstDrafter.name : "plain");
  $("prompt").value = defaults.prompt;
  $("probe-prefix").value = defaults.prompt;
  $("k").max = String(Math.min(info.limits.max_k, 12));
  $("k").value = String(defaults.k);
  $("max-new-tokens").max = String(info.limits.max_new_tokens);
  $("max-new-tokens").value = String(defaults.max_new_tokens);
  $("probe-top").max = String(info.limits.max_top);
  syncOutputs();
  document.body.dataset.ready = "true";
}

// --- drawing helpers -----------------------------------------------------------------------------

function visible(text) {  // a token as a chip shows its whitespace
  return text.replace(/ /g, "\u00b7").replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5") || "\u2205";
}

function chip(text, kind, title) {
  const span = document.createElement("span");
  span.className = `chip ${kind}`;
  span.textContent = kind === "prompt" ? text : visible(text);
  if (title) span.title = title;
  return span;
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  if (className) node.className = className;
  return node;
}

const fmt = (x, digits = 3) => (x === null || x === undefined ? "—" : Number(x).toFixed(digits));

function tokenTitle(t) {
  if (t.kind === "correction") return `correction: drawn from the residual norm(max(0, p - q)), p = ${fmt(t.p)}`;
  if (t.kind === "bonus") return `bonus: drawn from the target after a full acceptance, p = ${fmt(t.p)}`;
  const rule = t.uniform === null ? "greedy: accepted when it is the target's argmax"
    : `u = ${fmt(t.uniform)} ${t.kind === "accepted" ? "<" : ">="} min(1, p/q) = ${fmt(t.accept)}`;
  return `${t.kind}: p = ${fmt(t.p)}, q = ${fmt(t.q)}; ${rule}`;
}

// --- the step view -------------------------------------------------------------------------------

function drawOutput() {
  const run = state.run;
  const out = $("output");
  out.textContent = "";
  if (!run) { out.dataset.tokens = ""; return; }
  out.appendChild(chip(run.request.prompt, "prompt", "the prompt"));
  const emitted = [];
  run.steps.slice(0, state.shown).forEach((step, i) => {
    for (const t of step.tokens) {
      if (t.kind === "rejected") continue;
      const c = chip(t.text, t.kind, `step ${i + 1}: ${tokenTitle(t)}`);
      c.textContent = t.text;  // the text itself here, whitespace and all
      if (i + 1 === state.selected) c.classList.add("current");
      out.appendChild(c);
      emitted.push(t.token);
    }
  });
  out.dataset.tokens = emitted.join(",");
  out.dataset.shown = String(state.shown);
  out.dataset.steps = String(run.steps.length);
}

function drawSteps() {
  const list = $("steps");
  list.textContent = "";
  if (!state.run) return;
  state.run.steps.slice(0, state.shown).forEach((step, i) => {
    const row = el("div", null, "steprow" + (i + 1 === state.selected ? " selected" : ""));
    row.dataset.step = String(i + 1);
    row.appendChild(el("span", `step ${i + 1}`, "label"));
    for (const t of step.tokens) row.appendChild(chip(t.text, t.kind, tokenTitle(t)));
    row.addEventListener("click", () => { state.selected = i + 1; drawStepView(); });
    list.appendChild(row);
  });
}

function drawTree(step) {
  const box = $("draft-tree");
  box.textContent = "";
  const kinds = new Map();
  for (const t of step.tokens) if (t.node !== null) kinds.set(t.node, t.kind);
  const nodeChip = (d) => {
    const kind = kinds.get(d.node) || "untried";
    const c = chip(d.text, kind, `node ${d.node}, token ${d.token}: ${kind === "untried" ? "not tried (a sibling or another branch was taken), or past the EOS or the budget" : kind}`);
    c.dataset.node = String(d.node);
    return c;
  };
  const last = step.tokens[step.tokens.length - 1];
  const tail = last && (last.kind === "bonus" || last.kind === "correction") ? last : null;
  if (step.drafted.length === 0) {
    box.appendChild(el("p", "Nothing was drafted this step: the target decoded one token plainly.", "muted"));
    return;
  }
  box.appendChild(el("p", step.tree ? `The drafted tree (${step.drafted.length} nodes), verified in one forward:`
    : `The drafted chain (${step.drafted.length} tokens), verified in one forward:`, "muted"));
  if (!step.tree) {
    const row = el("div", null, "chainrow");
    row.appendChild(chip("context", "root", "the last committed token: row 0 of the verify forward"));
    for (const d of step.drafted) { row.appendChild(el("span", "\u2192", "arrow")); row.appendChild(nodeChip(d)); }
    if (tail) { row.appendChild(el("span", "  then ", "arrow")); row.appendChild(chip(tail.text, tail.kind, tokenTitle(tail))); }
    box.appendChild(row);
    return;
  }
  const children = new Map();
  for (const d of step.drafted) {
    if (!children.has(d.parent)) children.set(d.parent, []);
    children.get(d.parent).push(d);
  }
  const build = (parent) => {
    const ul = el("ul", null, parent === -1 ? "tree" : "");
    for (const d of children.get(parent) || []) {
      const li = el("li");
      li.appendChild(nodeChip(d));
      if (children.has(d.node)) li.appendChild(build(d.node));
      ul.appendChild(li);
    }
    return ul;
  };
  const root = el("ul", null, "tree");
  const li = el("li");
  li.appendChild(chip("context", "root", "the last committed token: the tree's root"));
  li.appendChild(build(-1));
  root.appendChild(li);
  box.appendChild(root);
  if (tail) {
    const p = el("p", `then the ${tail.kind}: `);
    p.appendChild(chip(tail.text, tail.kind, tokenTitle(tail)));
    box.appendChild(p);
  }
}

function drawTable(step) {
  const body = $("step-table").querySelector("tbody");
  body.textContent = "";
  const parentOf = (t) => (t.node === null ? null : step.drafted[t.node].parent);
  step.tokens.forEach((t, i) => {
    const previous = i > 0 ? step.tokens[i - 1] : null;
    const afterSibling = step.tree && previous && previous.kind === "rejected" && t.node !== null &&
      parentOf(previous) === parentOf(t);
    const tr = el("tr");
    tr.dataset.kind = t.kind;
    tr.dataset.token = String(t.token);
    tr.appendChild(el("td", String(i + 1), "num"));
    tr.appendChild(el("td", t.node === null ? "—" : String(t.node), "num"));
    const cell = el("td");
    cell.appendChild(chip(t.text, t.kind));
    tr.appendChild(cell);
    tr.appendChild(el("td", fmt(t.p), "num"));
    tr.appendChild(el("td", t.kind === "correction" || t.kind === "bonus" ? "—" : fmt(t.q), "num"));
    tr.appendChild(el("td", fmt(t.accept), "num"));
    tr.appendChild(el("td", t.uniform === null ? "—" : fmt(t.uniform), "num"));
    let verdict = t.kind;
    if (t.kind === "accepted" || t.kind === "rejected") {
      verdict = t.uniform === null ? `${t.kind} (greedy: ${t.kind === "accepted" ? "is" : "is not"} the target's argmax)`
        : `${t.kind}: u ${t.kind === "accepted" ? "<" : "\u2265"} min(1, p/q)`;
      if (afterSibling && t.uniform !== null) verdict += " (on the residual the rejected sibling left, not on p)";
    } else if (t.kind === "correction") {
      verdict = "correction, drawn from norm(max(0, p \u2212 q))";
    } else {
      verdict = "bonus, drawn from p after a full acceptance";
    }
    tr.appendChild(el("td", verdict));
    body.appendChild(tr);
  });
}

// Token-wise and block verification of this step's draft with the same draws u (a sampled chain
// only): token-wise stops at its first failed u_i < a_i; block (Sun et al., ICLR 2025) keeps the
// longest prefix i whose own test u_i < h_i passed, whatever the shorter prefixes' tests gave.
function drawRules(step, rule) {
  const box = $("rules");
  box.textContent = "";
  const rules = step.rules;
  box.hidden = !rules;
  if (!rules) return;
  box.appendChild(el("h2", "Token-wise and block verification of this draft"));
  box.appendChild(el("p", "The same draft and the same draws u. Token-wise stops at the first position whose " +
    "u \u2265 min(1, p/q). Block tests each prefix on its own (u_i < h_i) and keeps the longest that passed, so it " +
    "can keep a later prefix after an earlier token's test failed. Green: the tokens each rule keeps; \u2713/\u2717: " +
    `that position's own test. This run verified ${rule === "token" ? "token-wise; the block row says what block " +
    "verification would have kept" : "by block verification; the token-wise row says what token-wise verification " +
    "would have kept"}.`, "muted"));
  const table = el("table");
  table.id = "rules-table";
  const head = el("tr");
  head.appendChild(el("th", "rule"));
  rules.uniforms.forEach((_, i) => head.appendChild(el("th", `${i + 1}`)));
  head.appendChild(el("th", "keeps"));
  table.appendChild(el("thead")).appendChild(head);
  const body = el("tbody");
  const uniforms = el("tr");
  uniforms.appendChild(el("td", "u"));
  for (const u of rules.uniforms) uniforms.appendChild(el("td", fmt(u), "num"));
  uniforms.appendChild(el("td", ""));
  body.appendChild(uniforms);
  const rows = [["token", "token-wise: a_i = min(1, p/q)", rules.acceptance, rules.token_kept],
                ["block", "block: h_i (tests the prefix 1..i)", rules.block_h, rules.block_kept]];
  for (const [name, label, tests, kept] of rows) {
    const tr = el("tr");
    tr.dataset.rule = name;
    tr.dataset.kept = String(kept);
    tr.appendChild(el("td", label));
    tests.forEach((x, i) => {
      const passed = rules.uniforms[i] < x;
      const cell = el("td", `${fmt(x)} ${passed ? "\u2713" : "\u2717"}`, "num" + (i < kept ? " ok" : ""));
      cell.title = `u = ${fmt(rules.uniforms[i])} ${passed ? "<" : "\u2265"} ${fmt(x)}: ${passed ? "passed" : "failed"}`;
      tr.appendChild(cell);
    });
    tr.appendChild(el("td", `keeps ${kept}`));
    body.appendChild(tr);
  }
  table.appendChild(body);
  box.appendChild(table);
  const more = rules.block_kept - rules.token_kept;
  const counts = `block keeps ${tokenCount(rules.block_kept)}, token-wise ${tokenCount(rules.token_kept)}`;
  box.appendChild(el("p", more === 0 ? `Both rules keep ${tokenCount(rules.token_kept)} here.`
    : `Here ${counts}. On one draw either rule can keep more; on average block never keeps fewer, and both ` +
      "give exactly the target's distribution.", "muted"));
}

function tokenCount(n) { return `${n} token${n === 1 ? "" : "s"}`; }

function cacheBlock(name, lengths, grewWord) {
  const box = el("div", null, "cache");
  if (!lengths) {
    box.appendChild(el("div", `${name}: keeps no KV cache of its own (or does not report one).`, "muted"));
    return box;
  }
  const [before, grown, after] = lengths;
  const dropped = Math.max(0, grown - after);
  box.appendChild(el("div", `${name}: ${before} \u2192 ${grown} after ${grewWord} \u2192 ${after} after the rollback` +
    (dropped ? ` (${dropped} rolled back)` : "")));
  box.dataset.lengths = lengths.join(",");
  const widest = Math.max(1, before, grown, after);
  const bars = el("div", null, "bars");
  for (const [value, kind] of [[before, ""], [grown, "grown"], [after, "kept"]]) {
    const bar = el("div", null, `bar ${kind}`);
    bar.style.width = `${(100 * value) / widest}%`;
    bar.title = `${value} positions`;
    bars.appendChild(bar);
  }
  box.appendChild(bars);
  return box;
}

function drawCaches(step) {
  const box = $("caches");
  box.textContent = "";
  if (!step.caches) return;
  box.appendChild(el("h2", "Caches"));
  box.appendChild(cacheBlock("target KV cache", step.caches.target, "the verify forward"));
  box.appendChild(cacheBlock("drafter cache", step.caches.drafter, "drafting"));
}

function drawStepView() {
  drawOutput();
  drawSteps();
  const run = state.run;
  const detail = $("detail");
  if (!run || state.selected < 1) { detail.hidden = true; $("status").textContent = ""; return; }
  const step = run.steps[state.selected - 1];
  detail.hidden = false;
  detail.dataset.step = String(state.selected);
  const emitted = step.tokens.filter((t) => t.kind !== "rejected").length;
  $("detail-title").textContent = `Step ${state.selected} of ${run.steps.length}: ${emitted} token${emitted === 1 ? "" : "s"} for one target forward`;
  const accepted = step.tokens.filter((t) => t.kind === "accepted").length;
  const block = step.draft_forwards === 1 && step.drafted.length > 1 ?
    ` The drafter proposed all ${step.drafted.length} at once, in one forward (a block drafter).` : "";
  $("detail-explain").textContent = step.drafted.length ? `${accepted} of the drafted tokens were accepted` +
    ` (draft ${fmt(step.draft_ms, 2)} ms, verify ${fmt(step.verify_ms, 2)} ms; plain decoding of these ${emitted} ` +
    `token${emitted === 1 ? "" : "s"}: ${fmt(step.plain_ms, 2)} ms).` + block : "";
  if (step.note) $("detail-explain").textContent += ` The drafter's decision: ${step.note}.`;
  drawTree(step);
  drawTable(step);
  drawRules(step, run.verify_rule);
  drawCaches(step);
  const s = run.summary;
  $("status").textContent = `showing ${state.shown} of ${run.steps.length} steps; the whole run: ${s.new_tokens} tokens ` +
    `in ${s.steps} target forwards, mean accepted length ${fmt(s.mean_accepted_length, 2)}`;
}

function runKey() { return JSON.stringify(settings()); }

async function fetchRun() {
  const data = await api("/api/run", settings());
  state.run = data;
  state.runKey = runKey();
  drawTimeline();
}

function doRun() {
  return busy("running…", async () => {
    await fetchRun();
    state.shown = state.run.steps.length;
    state.selected = state.shown;
    drawStepView();
  });
}

function doStep() {
  return busy("stepping…", async () => {
    if (!state.run || state.runKey !== runKey()) {
      await fetchRun();
      state.shown = 0;
    }
    if (state.shown < state.run.steps.length) state.shown += 1;
    state.selected = state.shown;
    drawStepView();
  });
}

function doReset() {
  state.run = null; state.runKey = null; state.shown = 0; state.selected = 0;
  drawStepView();
  drawTimeline();
  showError(null);
}

// --- the timeline --------------------------------------------------------------------------------

function drawTimeline() {
  const summary = $("timeline-summary");
  const box = $("timeline");
  summary.textContent = "";
  box.textContent = "";
  const run = state.run;
  if (!run) { box.appendChild(el("p", "Run or step first.", "muted")); return; }
  const s = run.summary;
  const facts = [
    ["drafter", `${run.drafter}${run.tree ? " (trees)" : ""}, k = ${run.request.k}`],
    ["tokens", `${s.new_tokens}`],
    ["target forwards", `${s.steps} (plain decoding: ${s.plain_forwards}; ${s.forwards_saved} saved)`],
    ["mean accepted length", fmt(s.mean_accepted_length, 2)],
    ["draft tax", `${fmt(100 * s.draft_tax, 1)}% of the speculative time (${fmt(s.draft_ms, 1)} ms drafting)`],
    ["speculative", `${fmt(s.draft_ms + s.verify_ms, 1)} ms (draft ${fmt(s.draft_ms, 1)} + verify ${fmt(s.verify_ms, 1)})`],
    ["plain decoding", `${fmt(s.plain_ms, 1)} ms`],
    ["speedup", `${fmt(s.speedup, 2)}\u00d7`],
  ];
  for (const [key, value] of facts) {
    summary.appendChild(el("dt", key));
    const dd = el("dd", value);
    dd.dataset.fact = key;
    summary.appendChild(dd);
  }
  const widest = Math.max(1e-9, ...run.steps.map((st) => Math.max(st.draft_ms + st.verify_ms, st.plain_ms)));
  run.steps.forEach((st, i) => {
    const row = el("div", null, "tl-row");
    row.dataset.step = String(i + 1);
    row.appendChild(el("span", `step ${i + 1}`, "label"));
    const bars = el("div", null, "tl-bars");
    const spec = el("div");
    for (const [ms, kind] of [[st.draft_ms, "draft"], [st.verify_ms, "verify"]]) {
      const bar = el("span", null, `tl-bar ${kind}`);
      bar.style.width = `${(100 * ms) / widest}%`;
      bar.title = `${kind} ${fmt(ms, 2)} ms`;
      spec.appendChild(bar);
    }
    const plain = el("div");
    const bar = el("span", null, "tl-bar plain");
    bar.style.width = `${(100 * st.plain_ms) / widest}%`;
    bar.title = `plain decoding of the ${st.emitted.length} tokens: ${fmt(st.plain_ms, 2)} ms`;
    plain.appendChild(bar);
    bars.appendChild(spec);
    bars.appendChild(plain);
    row.appendChild(bars);
    row.appendChild(el("span", `${fmt(st.draft_ms + st.verify_ms, 2)} vs ${fmt(st.plain_ms, 2)} ms, ${st.emitted.length} tok`, "ms"));
    box.appendChild(row);
  });
}

// --- the probe -----------------------------------------------------------------------------------

function doProbe() {
  return busy("probing…", async () => {
    const data = await api("/api/probe", { prefix: $("probe-prefix").value, continuation: $("probe-continuation").value,
                                           top: Number($("probe-top").value) });
    const body = $("probe-table").querySelector("tbody");
    body.textContent = "";
    const kinds = { accepted: "accepted", rejected: "rejected", "not reached": "untried" };
    data.positions.forEach((p, i) => {
      const tr = el("tr");
      tr.dataset.verdict = p.verdict;
      tr.dataset.token = String(p.token);
      tr.appendChild(el("td", String(i), "num"));
      const cell = el("td");
      cell.appendChild(chip(p.text, kinds[p.verdict]));
      tr.appendChild(cell);
      tr.appendChild(el("td", fmt(p.probability), "num"));
      tr.appendChild(el("td", String(p.rank), "num"));
      const verdict = el("td", p.verdict === "rejected" ? "rejected \u2192 " : p.verdict);
      if (p.verdict === "rejected") verdict.appendChild(chip(data.correction_text, "correction"));
      tr.appendChild(verdict);
      const tops = el("td");
      for (const t of p.top) { tops.appendChild(chip(t.text, "plain")); tops.appendChild(el("span", ` ${fmt(t.probability, 2)} `)); }
      tr.appendChild(tops);
      body.appendChild(tr);
    });
    $("probe-table").hidden = false;
    const summary = $("probe-summary");
    summary.textContent = data.bonus ? `All ${data.positions.length} accepted; the bonus token would be `
      : `${data.num_accepted} accepted, then the correction `;
    summary.appendChild(chip(data.correction_text, data.bonus ? "bonus" : "correction"));
    summary.dataset.accepted = String(data.num_accepted);
    summary.dataset.correction = String(data.correction);
    $("status").textContent = "probed in one target forward";
  });
}

// --- compare -------------------------------------------------------------------------------------

function doCompare() {
  return busy("comparing every drafter…", async () => {
    const s = settings();
    const data = await api("/api/compare", { prompt: s.prompt, k: s.k, shape: s.shape, temperature: s.temperature,
                                             top_p: s.top_p, max_new_tokens: s.max_new_tokens, seed: s.seed });
    const body = $("compare-table").querySelector("tbody");
    body.textContent = "";
    for (const r of data.rows) {
      const tr = el("tr");
      tr.dataset.drafter = r.drafter;
      if (r.error) {
        tr.dataset.error = r.error;
        tr.appendChild(el("td", r.drafter));
        tr.appendChild(el("td", r.shape || "—"));
        const cell = el("td", r.error, "bad");
        cell.colSpan = 6;
        tr.appendChild(cell);
        body.appendChild(tr);
        continue;
      }
      tr.dataset.tokens = r.tokens.join(",");
      tr.dataset.mean = String(r.mean_accepted_length);
      tr.dataset.steps = String(r.steps);
      tr.appendChild(el("td", r.drafter));
      tr.appendChild(el("td", r.shape));
      const same = r.same_as_plain === null ? "sampled" : (r.same_as_plain ? "yes" : "NO");
      tr.appendChild(el("td", same, r.same_as_plain === false ? "bad" : (r.same_as_plain ? "ok" : "")));
      tr.appendChild(el("td", fmt(r.mean_accepted_length, 2), "num"));
      tr.appendChild(el("td", String(r.steps), "num"));
      tr.appendChild(el("td", fmt(r.decode_ms, 1), "num"));
      tr.appendChild(el("td", `${fmt(r.speedup, 2)}\u00d7`, "num"));
      tr.appendChild(el("td", r.text, "text-cell"));
      body.appendChild(tr);
    }
    $("compare-table").hidden = false;
    drawCompareBudget(data.budget);
    $("status").textContent = `compared ${data.rows.length} rows` + (data.greedy ? " at temperature 0" : "");
  });
}

function drawCompareBudget(budget) {  // a note under the table when compare decoded less than was asked
  let note = $("compare-budget");
  if (!note) {
    note = el("p", null, "muted");
    note.id = "compare-budget";
    $("compare-table").after(note);
  }
  note.hidden = !budget.capped;
  note.textContent = budget.capped ? `compare decodes at most ${budget.cap} tokens per drafter: every drafter ` +
    `runs on the prompt (you asked for ${budget.asked}; the step view and the timeline decode them all)` : "";
  note.dataset.decoded = String(budget.decoded);
  note.dataset.capped = String(budget.capped);
}

// --- wiring --------------------------------------------------------------------------------------

function showView(name) {
  document.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t.dataset.view === name));
  document.querySelectorAll(".view").forEach((v) => { v.hidden = v.id !== `view-${name}`; });
  $("controls").hidden = name === "probe";
  document.body.dataset.view = name;
}

document.querySelectorAll(".tab").forEach((t) => t.addEventListener("click", () => showView(t.dataset.view)));
for (const id of ["k", "temperature", "top-p", "drafter"]) $(id).addEventListener("input", syncOutputs);
$("run").addEventListener("click", doRun);
$("step").addEventListener("click", doStep);
$("reset").addEventListener("click", doReset);
$("probe-run").addEventListener("click", doProbe);
$("compare-run").addEventListener("click", doCompare);
showView("step");
drawTimeline();
loadInfo().catch(showError);
