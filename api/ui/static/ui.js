// Spar results UI: the live progress of a batch run.  A batch page that is still running
// names its progress URL (data-progress-url); poll it every second, update the badge, the
// counters, the bar, the rate limit holding it back (if one does) and each run's row
// (status, turns passed, when it ended), and reload the page once the batch is over (for
// its final state, its runs in order and its judge trust).  Each poll asks only for the
// runs changed since the previous look (since: the page's own, data-progress-since, then
// each answer's cursor): a batch of thousands of runs is not read whole every second.
// Text only (textContent): nothing received is parsed as HTML.
"use strict";

(function () {
  const section = document.querySelector("[data-progress-url]");
  if (!section) return;
  const url = section.dataset.progressUrl;
  let since = section.dataset.progressSince || null;
  const POLL_MS = 1000;

  function setText(element, value) {
    if (element) element.textContent = String(value);
  }

  function setStatus(element, status, tone) {
    if (!element) return;
    element.textContent = status;
    element.className = "status status-" + (tone || status);
  }

  // As the server writes a moment (the pages' "when" filter): 2025-01-31 13:45:07 UTC.
  function when(moment) {
    if (!moment) return "\u2014";
    const date = new Date(moment);
    if (Number.isNaN(date.getTime())) return String(moment);
    return date.toISOString().slice(0, 19).replace("T", " ") + " UTC";
  }

  function show(batch, badge) {
    setStatus(section.querySelector('[data-field="status"]'), badge.text, badge.tone);
    setText(document.getElementById("completed"), batch.completed_scenarios);
    setText(document.getElementById("total"), batch.total_scenarios);
    setText(document.getElementById("passed"), batch.passed_scenarios);
    setText(document.getElementById("failed"), batch.failed_scenarios);
    setText(document.getElementById("errors"), batch.error_scenarios);
    const limited = document.getElementById("rate-limited");
    if (limited) {
      const held = batch.rate_limited;
      limited.hidden = !held;
      limited.textContent = held
        ? "Held back by the rate limit of " + held.destination + " (" + held.kind +
          " calls) since " + when(held.since)
        : "";
    }
    const bar = document.getElementById("progress");
    if (bar) {
      bar.max = batch.total_scenarios;
      bar.value = batch.completed_scenarios;
    }
    const rows = new Map();
    for (const row of document.querySelectorAll("tr[data-run]")) rows.set(row.dataset.run, row);
    for (const run of batch.runs || []) {
      const row = rows.get(run.id);
      if (!row) continue;
      setStatus(row.querySelector('[data-field="status"]'), run.status);
      setText(row.querySelector('[data-field="passed_turns"]'), run.passed_turns);
      setText(row.querySelector('[data-field="completed_at"]'), when(run.completed_at));
    }
  }

  async function poll() {
    let body = null;
    try {
      const query = since ? "?since=" + encodeURIComponent(since) : "";
      const response = await fetch(url + query, {
        headers: { accept: "application/json" },
        credentials: "same-origin",
        cache: "no-store",
      });
      const json = (response.headers.get("content-type") || "").includes("application/json");
      if (!response.ok || !json) {
        // Signed out, or the batch is gone: a reload shows why.
        window.location.reload();
        return;
      }
      body = await response.json();
    } catch (error) {
      window.setTimeout(poll, POLL_MS); // the server is unreachable for now: try again
      return;
    }
    since = body.cursor;
    show(body.batch, body.badge);
    if (body.over) {
      window.location.reload();
      return;
    }
    window.setTimeout(poll, POLL_MS);
  }

  window.setTimeout(poll, POLL_MS);
})();
