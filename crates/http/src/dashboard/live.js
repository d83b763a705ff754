// Live progress of import jobs and of opening workspaces: each row of a job still queued or
// running asks the API for its job until it ends, then the page is loaded again to show the
// result; the rows of opens in progress follow /api/v1/workspaces until their open ends.
// Without this script the pages still work (loaded again by hand).
"use strict";
(function () {
  const ENDED = ["done", "failed", "cancelled"];
  function watch(row) {
    const id = row.dataset.job;
    const put = (field, text) => {
      const cell = row.querySelector(`[data-field="${field}"]`);
      if (cell) cell.textContent = text;
    };
    const tick = async () => {
      let job;
      try {
        const r = await fetch(`/api/v1/imports/${encodeURIComponent(id)}`, { headers: { Accept: "application/json" } });
        if (!r.ok) return setTimeout(tick, 2000);
        job = await r.json();
      } catch (e) {
        return setTimeout(tick, 2000);
      }
      put("state", job.state);
      put("phase", job.phase || "");
      put("bytes", job.bytes != null ? `${job.bytes} bytes` : "");
      if (ENDED.includes(job.state)) {
        location.reload();
      } else {
        setTimeout(tick, 500);
      }
    };
    setTimeout(tick, 300);
  }
  // Rows of opens in progress are updated in place; one no longer listed (opened, failed, or
  // listed by another runner of a fleet) is marked ended and no longer followed. Nothing is
  // reloaded: the operator reloads to see the workspace.
  function watchOpens(rows) {
    let watched = rows;
    const tick = async () => {
      let listed;
      try {
        const r = await fetch("/api/v1/workspaces", { headers: { Accept: "application/json" } });
        if (!r.ok) return setTimeout(tick, 2000);
        listed = await r.json();
      } catch (e) {
        return setTimeout(tick, 2000);
      }
      const now = new Map((listed.opening || []).map((o) => [o.workspace, o]));
      watched = watched.filter((row) => {
        const put = (field, text) => {
          const cell = row.querySelector(`[data-field="${field}"]`);
          if (cell) cell.textContent = text;
        };
        const o = now.get(row.dataset.opening);
        if (!o) {
          put("step", "ended: reload to see it");
          return false;
        }
        put("step", o.step);
        put("steps", `${o.done} of ${o.total} steps`);
        put("bytes", `${o.bytes} bytes`);
        return true;
      });
      if (watched.length) setTimeout(tick, 500);
    };
    setTimeout(tick, 300);
  }
  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("tr[data-job][data-live]").forEach(watch);
    const opening = [...document.querySelectorAll("tr[data-opening]")];
    if (opening.length) watchOpens(opening);
  });
})();
