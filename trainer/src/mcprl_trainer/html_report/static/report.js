/* mcp-rl run report: curves, a trajectory browser and the eval before/after.
 *
 * The index (metrics, evals, one summary row per rollout) is inline; a step's rollouts are
 * loaded when the step is opened, by adding report-data/<kind>-<step>.js as a <script>, which
 * calls mcprlReport.receive(). Everything that came from a model, a tool or a scenario goes
 * into the DOM as text nodes, never as HTML.
 */
(function () {
  'use strict';

  const INDEX = JSON.parse(document.getElementById('mcprl-index').textContent);
  const SVGNS = 'http://www.w3.org/2000/svg';
  const COLORS = ['#2557c7', '#d9480f', '#1a7f37', '#8e44ad', '#b7791f', '#0b7285'];
  const COMPLETE_TASK = 'complete_task';

  // ---- DOM helpers: attributes are ours; children that are strings become text nodes ----
  function setAttrs(node, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? '' : String(value));
    }
  }
  function append(node, children) {
    for (const child of [children].flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    return append(node, children);
  }
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVGNS, tag);
    setAttrs(node, attrs);
    return append(node, children);
  }
  /** Replace the children of ``node`` (strings become text nodes, as in el). */
  function fill(node, ...children) {
    node.replaceChildren();
    return append(node, children);
  }
  const $ = (id) => document.getElementById(id);
  const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
  function fmt(v, digits = 3) {
    if (!isNum(v)) return v === null || v === undefined ? '–' : String(v);
    return Number.isInteger(v) ? String(v) : v.toFixed(digits);
  }
  const signed = (v) => (isNum(v) ? (v >= 0 ? '+' : '') + v.toFixed(2) : '–');
  const pct = (v) => (isNum(v) ? (100 * v).toFixed(1) + '%' : '–');
  const clipText = (s, n) => (s.length > n ? s.slice(0, n - 1) + '…' : s);

  // ---- per-step data, loaded on demand (script tags work from file://, fetch does not) ----
  const cache = { train: new Map(), eval: new Map() };
  const waiting = new Map();
  let current = Promise.resolve();
  const report = {
    receive(kind, step, data) {
      cache[kind].set(step, data);
      const key = kind + ':' + step;
      const w = waiting.get(key);
      if (w) { waiting.delete(key); w.resolve(data); }
    },
    /** Resolves once every render started so far (and any it started) has finished. */
    async settled() {
      let seen;
      do { seen = current; await seen; } while (seen !== current);
    },
  };
  window.mcprlReport = report;
  function track(promise) {
    current = Promise.all([current, promise.catch(showError)]);
    return current;
  }
  function showError(err) {
    const box = $('load-errors') || document.body.insertBefore(
      el('div', { id: 'load-errors', class: 'tag bad' }), document.body.firstChild);
    box.textContent = String(err && err.message ? err.message : err);
  }
  function load(kind, step) {
    if (cache[kind].has(step)) return Promise.resolve(cache[kind].get(step));
    const key = kind + ':' + step;
    if (waiting.has(key)) return waiting.get(key).promise;
    const w = {};
    w.promise = new Promise((resolve, reject) => { w.resolve = resolve; w.reject = reject; });
    waiting.set(key, w);
    const tag = document.createElement('script');
    tag.src = INDEX.data_dir + '/' + kind + '-' + String(step).padStart(4, '0') + '.js';
    const fail = (why) => {
      if (waiting.get(key) === w) { waiting.delete(key); w.reject(new Error(why)); }
    };
    tag.onerror = () => { tag.remove(); fail('cannot load ' + tag.src); };
    tag.onload = () => { tag.remove(); fail(tag.src + ' has no ' + kind + ' step ' + step); };
    document.head.appendChild(tag);
    return w.promise;
  }

  // ---- the run's facts ----
  const H = INDEX.history || [];
  const E = INDEX.evals || [];
  const scenarios = INDEX.scenarios || [];
  const scenarioById = new Map(scenarios.map((s) => [s.id, s]));
  const T = INDEX.train.cols;
  const NT = T.step.length;
  const V = INDEX.eval.cols;
  const rowOf = new Map();  // "step:group:member" -> row of the train columns
  for (let i = 0; i < NT; i++) rowOf.set(T.step[i] + ':' + T.group[i] + ':' + T.member[i], i);

  function perStep(part, col) {
    const acc = new Map();
    const c = part.cols;
    for (let i = 0; i < c.step.length; i++) {
      const a = acc.get(c.step[i]) || [0, 0];
      a[0] += c[col][i]; a[1] += 1;
      acc.set(c.step[i], a);
    }
    return [...acc].map(([s, [sum, n]]) => [s, sum / n]).sort((a, b) => a[0] - b[0]);
  }
  const series = (rows, key) => rows.filter((r) => isNum(r[key])).map((r) => [r.step, r[key]]);

  function renderHeader() {
    const run = INDEX.run;
    append($('top'), [
      el('h1', {}, 'Run ', run.name),
      el('div', { class: 'facts' },
        `model ${run.model} · step ${run.steps_done} of ${fmt(run.steps_planned)} · `
        + `${fmt(run.groups_per_step)} scenarios × ${fmt(run.group_size)} rollouts per step · `
        + `reward ${fmt(run.reward_mode)} · ${NT} training rollouts · written ${run.generated_at}`),
    ]);
  }

  function renderSummary() {
    const box = $('summary-section');
    if (!E.length) {
      append(box, el('p', { class: 'muted' }, 'No eval yet.'));
      return;
    }
    const first = E[0];
    const last = E[E.length - 1];
    const q = new Map(perStep(INDEX.eval, 'queried'));
    const rows = [['held-out success', 'success_rate', pct], ['mean reward', 'mean_reward', fmt],
      ['mean turns', 'mean_turns', (v) => fmt(v, 2)], ['tool-error rate', 'tool_error_rate', pct],
      ['rollouts', 'n', fmt]];
    append(box, el('table', { id: 'summary-table' },
      el('tr', {}, el('th', {}, 'eval'), el('th', {}, `before (step ${first.step})`),
        el('th', {}, `after (step ${last.step})`)),
      rows.map(([label, key, f]) => el('tr', {}, el('td', {}, label), el('td', {}, f(first[key])),
        el('td', {}, f(last[key])))),
      el('tr', {}, el('td', {}, 'query rate'), el('td', {}, pct(q.get(first.step))),
        el('td', {}, pct(q.get(last.step))))));
  }

  // ---- curves: small SVG line charts ----
  function niceTicks(lo, hi, count, minStep = 0) {
    const raw = (hi - lo) / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = Math.max(minStep, [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw);
    const ticks = [];
    const first = Math.ceil(lo / step - 1e-9);
    for (let k = first; k * step <= hi + step * 1e-9; k++) ticks.push(+(k * step).toPrecision(12));
    return ticks;
  }

  function chart(spec) {
    const card = el('div', { class: 'chart', id: 'chart-' + spec.id },
      el('div', { class: 'title' }, spec.title));
    const points = spec.series.flatMap((s) => s.points.concat(
      (s.band || []).flatMap((b) => [[b[0], b[1]], [b[0], b[2]]])));
    card.dataset.points = String(spec.series.reduce((n, s) => n + s.points.length, 0));
    if (!points.length) {
      append(card, el('div', { class: 'empty' }, spec.empty || 'no data yet'));
      return card;
    }
    const W = 380, HT = 180, m = { l: 46, r: 10, t: 8, b: 22 };
    const xs = points.map((p) => p[0]);
    const ys = points.map((p) => p[1]);
    let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    let y0 = Math.min(spec.yMin ?? Infinity, ...ys);
    let y1 = Math.max(spec.yMax ?? -Infinity, ...ys);
    if (y0 === y1) { y0 -= y0 === 0 ? 0 : Math.abs(y0) * 0.5; y1 += y1 === 0 ? 1 : Math.abs(y1) * 0.5; }
    const sx = (v) => m.l + ((v - x0) / (x1 - x0)) * (W - m.l - m.r);
    const sy = (v) => HT - m.b - ((v - y0) / (y1 - y0)) * (HT - m.t - m.b);
    const root = svg('svg', { viewBox: `0 0 ${W} ${HT}`, role: 'img', 'aria-label': spec.title });
    for (const t of niceTicks(y0, y1, 4)) {
      append(root, [svg('line', { class: 'grid', x1: m.l, x2: W - m.r, y1: sy(t), y2: sy(t) }),
        svg('text', { x: m.l - 4, y: sy(t) + 3, 'text-anchor': 'end' }, String(+t.toPrecision(4)))]);
    }
    for (const t of niceTicks(x0, x1, 6, 1)) {
      append(root, svg('text', { x: sx(t), y: HT - 6, 'text-anchor': 'middle' }, t));
    }
    append(root, svg('line', { class: 'axis', x1: m.l, x2: m.l, y1: m.t, y2: HT - m.b }));
    append(root, svg('line', { class: 'axis', x1: m.l, x2: W - m.r, y1: HT - m.b, y2: HT - m.b }));
    const legend = el('div', { class: 'legend' });
    spec.series.forEach((s, i) => {
      const color = COLORS[i % COLORS.length];
      if (s.band && s.band.length) {
        const upper = s.band.map((b) => `${sx(b[0])},${sy(b[2])}`);
        const lower = s.band.slice().reverse().map((b) => `${sx(b[0])},${sy(b[1])}`);
        append(root, svg('polygon', { class: 'band', points: upper.concat(lower).join(' '),
          fill: color, 'fill-opacity': 0.15, stroke: 'none' }));
      }
      if (!s.points.length) return;
      const d = s.points.map((p, k) => `${k ? 'L' : 'M'}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`);
      append(root, svg('path', { class: 'line', 'data-series': s.name, d: d.join(''), fill: 'none',
        stroke: color, 'stroke-width': 1.8, 'stroke-dasharray': s.dashed ? '5 3' : null }));
      if (s.points.length <= 60) {
        for (const p of s.points) {
          append(root, svg('circle', { cx: sx(p[0]), cy: sy(p[1]), r: 2.4, fill: color },
            svg('title', {}, `${s.name}, step ${p[0]}: ${fmt(p[1], 4)}`)));
        }
      }
      append(legend, el('span', {}, el('i', { style: `background:${color}` }), s.name));
    });
    append(card, [legend, root]);
    return card;
  }

  function renderCurves() {
    const band = H.filter((r) => isNum(r.reward_mean) && isNum(r.reward_std))
      .map((r) => [r.step, r.reward_mean - r.reward_std, r.reward_mean + r.reward_std]);
    const specs = [
      { id: 'reward', title: 'Train reward (mean ± std)', series: [
        { name: 'train reward (mean)', points: series(H, 'reward_mean'), band },
        { name: 'val reward (mean)', points: series(E, 'mean_reward'), dashed: true }] },
      { id: 'success', title: 'Held-out success', yMin: 0, yMax: 1, series: [
        { name: 'val success', points: series(E, 'success_rate') },
        { name: 'train success', points: series(H, 'success_rate'), dashed: true }] },
      { id: 'query', title: 'Query rate (rollouts that called run_query, or any server tool)',
        yMin: 0, yMax: 1, series: [
          { name: 'train', points: perStep(INDEX.train, 'queried') },
          { name: 'val', points: perStep(INDEX.eval, 'queried'), dashed: true }] },
      { id: 'tool-errors', title: 'Tool-error rate (errors per tool call)', yMin: 0, series: [
        { name: 'train', points: series(H, 'tool_error_rate') },
        { name: 'val', points: series(E, 'tool_error_rate'), dashed: true }] },
      { id: 'kl', title: 'KL to the base model', yMin: 0,
        empty: 'no data: KL is computed when train.kl_coef > 0', series: [
        { name: 'kl', points: series(H, 'kl') }] },
      { id: 'clip', title: 'Clip fraction', yMin: 0, series: [
        { name: 'clip fraction', points: series(H, 'clip_fraction') }] },
      { id: 'phases', title: 'Seconds per phase of a step', yMin: 0, series: [
        { name: 'rollout', points: series(H, 'rollout_seconds') },
        { name: 'judge (after rollouts)', points: series(H, 'judge_seconds') },
        { name: 'train', points: series(H, 'train_seconds') },
        { name: 'checkpoint (critical path)', points: series(H, 'checkpoint_seconds') },
        { name: 'publish', points: series(H, 'publish_seconds') },
        { name: 'whole step', points: series(H, 'step_seconds'), dashed: true }] },
      { id: 'tokens', title: 'Tokens per second', yMin: 0, series: [
        { name: 'rollout (sampled)', points: series(H, 'rollout_tokens_per_s') },
        { name: 'train (processed)', points: series(H, 'train_tokens_per_s') }] },
    ];
    append($('curves'), specs.map(chart));
  }

  // ---- one rollout, in full ----
  function box(label, ...children) {
    return el('div', { class: 'box' }, el('div', { class: 'label' }, label), children);
  }

  function messagesView(messages) {
    const results = new Map();
    for (const m of messages) if (m.role === 'tool') results.set(m.call_id, m);
    const shown = new Set();
    const out = [];
    const resultView = (m) => el('div', { class: 'tool-result' + (m.error ? ' error' : '') },
      el('span', { class: 'label' }, m.error ? 'error result' : 'result'), el('pre', {}, m.content));
    for (const m of messages) {
      if (m.role === 'system') {
        out.push(el('details', { class: 'msg system' }, el('summary', { class: 'role' }, 'system prompt'),
          el('pre', {}, m.content)));
      } else if (m.role === 'tool') {
        if (shown.has(m.call_id)) continue;
        // A result without a parsed call (a malformed call) stands on its own.
        out.push(el('div', { class: 'msg tool' }, el('div', { class: 'role' }, 'tool'),
          el('div', { class: 'tool-call' }, resultView(m))));
      } else {
        const calls = (m.calls || []).map((c) => {
          const result = results.get(c.id);
          if (result) shown.add(c.id);
          return el('div', { class: 'tool-call' },
            el('div', { class: 'call-head' }, '→ ', c.name,
              c.name === COMPLETE_TASK ? el('span', { class: 'tag good' }, 'final answer') : null),
            el('div', { class: 'args' }, el('pre', {}, c.args)),
            result ? resultView(result) : null);
        });
        out.push(el('div', { class: 'msg ' + m.role }, el('div', { class: 'role' }, m.role),
          m.content ? el('pre', { class: 'content' }, m.content) : null, calls));
      }
    }
    return out;
  }

  function rolloutView(r, scenario, opts = {}) {
    const comps = Object.entries(r.components || {});
    const success = el('span', { class: 'tag ' + (r.success ? 'good' : 'bad') },
      r.success ? 'success' : 'no success');
    return el('div', { class: 'rollout', 'data-member': r.member },
      el('div', { class: 'head' },
        el('span', { class: 'reward' }, 'reward ', fmt(r.reward)), success,
        opts.noAdvantage ? null : el('span', { class: 'advantage' }, 'advantage ', signed(r.advantage)),
        el('span', {}, 'finish ', r.finish), el('span', {}, 'turns ', r.turns),
        el('span', {}, `tool calls ${r.tool_calls} (${r.tool_errors} errors, ${r.malformed} malformed)`),
        el('span', { class: 'muted' }, fmt(r.seconds, 2), ' s')),
      opts.hideTask ? null : box('task', el('pre', { class: 'task' }, scenario ? scenario.task : '?')),
      el('div', { class: 'facts-grid' },
        box('final answer', el('pre', { class: 'final-answer' },
          r.final_answer === null ? '(no answer: complete_task was not called)' : r.final_answer)),
        box('ground truth', el('pre', { class: 'ground-truth' },
          scenario && scenario.truth !== null ? scenario.truth : '(no ground truth)'))),
      el('div', { class: 'facts-grid' },
        box('reward components', comps.length
          ? el('table', { class: 'components' }, comps.map(([k, v]) =>
            el('tr', {}, el('td', {}, k), el('td', {}, fmt(v)))))
          : el('span', { class: 'muted' }, 'none')),
        box("judge's explanation", el('pre', { class: 'explanation' }, r.explanation || '(none)'))),
      el('div', { class: 'messages' }, messagesView(r.messages || [])));
  }

  // ---- the trajectory browser: filters -> steps -> groups -> rollout ----
  const state = { scenario: -1, rmin: null, rmax: null, error: 'any', finish: -1, step: null,
    pick: null };
  let mask = new Uint8Array(NT);

  function numberOrNull(input) {
    return input.value === '' || !Number.isFinite(+input.value) ? null : +input.value;
  }

  function renderFilters() {
    const counts = new Map();
    for (let i = 0; i < NT; i++) counts.set(T.scenario[i], (counts.get(T.scenario[i]) || 0) + 1);
    const scenarioSelect = el('select', { id: 'f-scenario' },
      el('option', { value: -1 }, `all scenarios (${counts.size})`),
      [...counts].map(([k, n]) => el('option', { value: k },
        `${clipText(scenarios[k].task, 90)} (${n})`)));
    const finishes = [...new Set(T.finish)];
    const finishSelect = el('select', { id: 'f-finish' }, el('option', { value: -1 }, 'any'),
      finishes.map((f) => el('option', { value: f }, INDEX.finishes[f])));
    const errorSelect = el('select', { id: 'f-error' },
      el('option', { value: 'any' }, 'any'),
      el('option', { value: 'with' }, 'with tool errors'),
      el('option', { value: 'without' }, 'without tool errors'));
    const rmin = el('input', { id: 'f-reward-min', type: 'number', step: 0.05, placeholder: 'min' });
    const rmax = el('input', { id: 'f-reward-max', type: 'number', step: 0.05, placeholder: 'max' });
    const update = () => {
      state.scenario = +scenarioSelect.value;
      state.finish = +finishSelect.value;
      state.error = errorSelect.value;
      state.rmin = numberOrNull(rmin);
      state.rmax = numberOrNull(rmax);
      applyFilters();
    };
    for (const c of [scenarioSelect, finishSelect, errorSelect]) c.addEventListener('change', update);
    for (const c of [rmin, rmax]) c.addEventListener('input', update);
    const reset = el('button', { id: 'f-reset', onclick: () => {
      scenarioSelect.value = '-1'; finishSelect.value = '-1'; errorSelect.value = 'any';
      rmin.value = ''; rmax.value = ''; update();
    } }, 'reset');
    append($('filters'), [el('label', {}, 'scenario', scenarioSelect),
      el('label', {}, 'reward from', rmin), el('label', {}, 'reward to', rmax),
      el('label', {}, 'tool errors', errorSelect), el('label', {}, 'finish', finishSelect), reset]);
  }

  function matches(i) {
    if (state.scenario >= 0 && T.scenario[i] !== state.scenario) return false;
    if (state.finish >= 0 && T.finish[i] !== state.finish) return false;
    if (state.error === 'with' && !(T.errors[i] > 0)) return false;
    if (state.error === 'without' && T.errors[i] > 0) return false;
    const r = T.reward[i];
    if (state.rmin !== null && !(isNum(r) && r >= state.rmin)) return false;
    if (state.rmax !== null && !(isNum(r) && r <= state.rmax)) return false;
    return true;
  }

  function applyFilters() {
    const perStepCount = new Map();
    let total = 0;
    mask = new Uint8Array(NT);
    for (let i = 0; i < NT; i++) {
      if (!matches(i)) continue;
      mask[i] = 1;
      total += 1;
      const a = perStepCount.get(T.step[i]) || [0, 0];
      a[0] += 1; a[1] += isNum(T.reward[i]) ? T.reward[i] : 0;
      perStepCount.set(T.step[i], a);
    }
    const countBox = $('match-count');
    countBox.dataset.matches = String(total);
    countBox.dataset.total = String(NT);
    countBox.textContent = `${total} of ${NT} training rollouts match, in ${perStepCount.size} `
      + `of ${INDEX.train.steps.length} steps.`;
    const list = $('step-list');
    fill(list, el('h3', {}, 'Steps'));
    for (const s of INDEX.train.steps) {
      const a = perStepCount.get(s);
      if (!a) continue;
      append(list, el('button', { class: 'item step-item', 'data-step': s,
        onclick: () => { state.step = s; state.pick = null; track(showStep(s)); } },
      `step ${s} · ${a[0]} rollouts · reward ${fmt(a[1] / a[0], 2)}`));
    }
    if (!perStepCount.has(state.step)) {
      state.step = perStepCount.size ? Math.max(...perStepCount.keys()) : null;
      state.pick = null;
    }
    return track(showStep(state.step));
  }

  async function showStep(step) {
    for (const b of document.querySelectorAll('.step-item')) {
      b.classList.toggle('selected', +b.dataset.step === step);
    }
    const groups = $('group-list');
    if (step === null) {
      fill(groups, el('p', { class: 'muted' }, NT ? 'No rollout matches the filters.'
        : 'No rollouts recorded (save_rollouts off, or no step done yet).'));
      fill($('rollout-detail'));
      return;
    }
    fill(groups, el('p', { class: 'muted' }, `loading step ${step}…`));
    const data = await load('train', step);
    if (state.step !== step) return;  // another step was chosen meanwhile
    const out = [el('h3', {}, `Step ${step}: groups`)];
    let first = null;
    for (const g of data.groups) {
      const shown = g.rollouts.filter((r) => mask[rowOf.get(step + ':' + g.group + ':' + r.member)]);
      if (!shown.length) continue;
      const scenario = scenarioById.get(g.scenario_id);
      const rewards = g.rollouts.map((r) => r.reward).filter(isNum);
      const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
      const equal = rewards.length > 1 && rewards.every((v) => v === rewards[0]);
      const items = shown.map((r) => {
        const pick = { step, group: g.group, member: r.member };
        first = first || pick;
        return el('button', { class: 'item rollout-item', 'data-group': g.group,
          'data-member': r.member, onclick: () => { state.pick = pick; showRollout(data); } },
        `#${r.member} · reward ${fmt(r.reward, 2)} · adv ${signed(r.advantage)}`,
        r.tool_errors ? el('span', { class: 'tag bad' }, `${r.tool_errors} tool err`) : null,
        el('span', { class: 'tag' + (r.finish === 'completed' ? ' good' : ' warn') }, r.finish));
      });
      out.push(el('div', { class: 'group', 'data-group': g.group },
        el('div', {}, el('b', {}, `group ${g.group}`), ` · mean reward ${fmt(mean, 2)}`,
          g.error ? el('span', { class: 'tag bad' }, 'failed: ', clipText(g.error, 120)) : null,
          equal ? el('span', { class: 'tag warn' }, 'equal rewards: no signal') : null),
        el('div', { class: 'task' }, scenario ? clipText(scenario.task, 240) : g.scenario_id),
        scenario && scenario.truth !== null
          ? el('div', { class: 'muted' }, 'truth: ', clipText(scenario.truth, 120)) : null,
        items));
    }
    fill(groups, out);
    const keep = state.pick && state.pick.step === step
      && mask[rowOf.get(step + ':' + state.pick.group + ':' + state.pick.member)];
    if (!keep) state.pick = first;
    showRollout(data);
  }

  function showRollout(data) {
    const pick = state.pick;
    for (const b of document.querySelectorAll('.rollout-item')) {
      b.classList.toggle('selected', pick !== null && +b.dataset.group === pick.group
        && +b.dataset.member === pick.member);
    }
    const detail = $('rollout-detail');
    if (!pick) { fill(detail); return; }
    const g = data.groups.find((x) => x.group === pick.group);
    const r = g && g.rollouts.find((x) => x.member === pick.member);
    if (!r) { fill(detail); return; }
    fill(detail, el('h3', {}, `Step ${pick.step}, group ${pick.group}, rollout #${pick.member}`),
      rolloutView(r, scenarioById.get(g.scenario_id)));
  }

  // ---- eval: each val scenario, the rollouts of two evals side by side ----
  const evalState = { before: null, after: null, scenario: null };

  function evalCounts(step) {
    const out = new Map();
    for (let i = 0; i < V.step.length; i++) {
      if (V.step[i] !== step) continue;
      const a = out.get(V.scenario[i]) || [0, 0];
      a[0] += V.success[i]; a[1] += 1;
      out.set(V.scenario[i], a);
    }
    return out;
  }

  function renderEval() {
    const steps = INDEX.eval.steps;
    if (!steps.length) {
      append($('eval-controls'), el('p', { class: 'muted' }, 'No eval rollouts recorded yet.'));
      $('eval-body').hidden = true;
      return Promise.resolve();
    }
    evalState.before = steps[0];
    evalState.after = steps[steps.length - 1];
    const pickers = ['before', 'after'].map((which) => {
      const select = el('select', { id: 'eval-' + which },
        steps.map((s) => el('option', { value: s, selected: s === evalState[which] }, `step ${s}`)));
      select.addEventListener('change', () => {
        evalState[which] = +select.value;
        track(showEvalScenarios());
      });
      return el('label', {}, which + ' ', select);
    });
    append($('eval-controls'), pickers);
    return showEvalScenarios();
  }

  function showEvalScenarios() {
    const before = evalCounts(evalState.before);
    const after = evalCounts(evalState.after);
    const keys = [...new Set([...before.keys(), ...after.keys()])];
    if (!keys.includes(evalState.scenario)) evalState.scenario = keys.length ? keys[0] : null;
    const frac = (a) => (a ? `${a[0]}/${a[1]}` : '–');
    fill($('eval-scenarios'), el('h3', {}, `Val scenarios (${keys.length})`),
      keys.map((k) => el('button', { class: 'item eval-scenario', 'data-scenario': k,
        onclick: () => { evalState.scenario = k; track(showEvalSides()); } },
      clipText(scenarios[k].task, 110), el('br'),
      el('span', { class: 'muted' }, `success ${frac(before.get(k))} → ${frac(after.get(k))}`))));
    return showEvalSides();
  }

  async function showEvalSides() {
    for (const b of document.querySelectorAll('.eval-scenario')) {
      b.classList.toggle('selected', +b.dataset.scenario === evalState.scenario);
    }
    const sides = $('eval-sides');
    if (evalState.scenario === null) { fill(sides); return; }
    const wanted = { ...evalState };
    const [before, after] = await Promise.all([load('eval', wanted.before), load('eval', wanted.after)]);
    if (wanted.scenario !== evalState.scenario || wanted.before !== evalState.before
      || wanted.after !== evalState.after) return;
    const scenario = scenarios[wanted.scenario];
    const side = (label, step, data) => {
      const rollouts = data.groups.filter((g) => g.scenario_id === scenario.id)
        .flatMap((g) => g.rollouts);
      const ok = rollouts.filter((r) => r.success).length;
      return el('div', { class: 'side', 'data-side': label },
        el('h3', {}, `${label}: step ${step} · success ${ok}/${rollouts.length}`),
        rollouts.length ? rollouts.map((r) => rolloutView(r, scenario,
          { hideTask: true, noAdvantage: true }))
          : el('p', { class: 'muted' }, 'not evaluated at this step'));
    };
    fill(sides, 
      el('div', { class: 'box', style: 'grid-column: 1 / -1' }, el('div', { class: 'label' }, 'task'),
        el('pre', {}, scenario.task)),
      side('before', wanted.before, before), side('after', wanted.after, after));
  }

  // ---- start ----
  renderHeader();
  renderSummary();
  renderCurves();
  renderFilters();
  track(applyFilters());
  track(renderEval());
  report.settled().then(() => { document.body.dataset.ready = '1'; });
})();
