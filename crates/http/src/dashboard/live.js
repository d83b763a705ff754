// Live progress of import jobs: each row of a job still queued or running asks the API for
// its job until it ends, then the page is loaded again to show the result. Without this
// script the page still works (its Refresh link).
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
  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("tr[data-job][data-live]").forEach(watch);
  });
})();
