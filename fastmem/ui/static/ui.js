// fastmem inspector: the little script the pages need (no library, no build step).
// Served from the package under the Content-Security-Policy "script-src 'self'".
(function () {
  "use strict";
  const POLL_MS = 2000;

  function get(url) {
    return fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { if (!r.ok) { throw new Error(r.status + " " + r.statusText); } return r.text(); });
  }

  // Widths from data-w (percent): set here, since the CSP forbids inline styles.
  function widths(root) {
    root.querySelectorAll("[data-w]").forEach(function (el) { el.style.width = el.dataset.w + "%"; });
  }

  // Timeline: a row opens the whole memory below it.
  function expand(row) {
    const detail = document.getElementById("detail-" + row.dataset.id);
    if (!detail) { return; }
    if (!detail.hidden) { detail.hidden = true; row.setAttribute("aria-expanded", "false"); return; }
    row.setAttribute("aria-expanded", "true");
    detail.hidden = false;
    if (!detail.dataset.loaded) {
      detail.textContent = "Loading…";
      get("/memory/" + encodeURIComponent(row.dataset.id) + "?partial=1").then(function (html) {
        detail.innerHTML = html; detail.dataset.loaded = "1"; widths(detail);
      }).catch(function (e) { detail.textContent = "Could not load it: " + e.message; });
    }
  }

  // Timeline: the next page, from the index (before = the last id shown).
  function more(button) {
    button.disabled = true;
    button.textContent = "Loading…";
    get("/timeline?partial=1&before=" + encodeURIComponent(button.dataset.next)).then(function (html) {
      const holder = document.createElement("div");
      holder.innerHTML = html;
      button.replaceWith.apply(button, Array.from(holder.childNodes));
      widths(document);
      watchMore();
    }).catch(function (e) { button.disabled = false; button.textContent = "Older memories (" + e.message + ")"; });
  }

  let observer = null;
  function watchMore() {
    const button = document.getElementById("more");
    if (!button || !("IntersectionObserver" in window)) { return; }
    if (observer) { observer.disconnect(); }
    observer = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) { if (e.isIntersecting && !e.target.disabled) { more(e.target); } });
    }, { rootMargin: "400px" });
    observer.observe(button);
  }

  document.addEventListener("click", function (event) {
    const t = event.target;
    if (!(t instanceof Element)) { return; }
    const row = t.closest(".row[data-id]");
    if (row && !t.closest("a")) { expand(row); return; }
    const moreButton = t.closest("#more");
    if (moreButton) { more(moreButton); return; }
    const fetcher = t.closest("[data-fetch]");
    if (fetcher) {
      const into = document.querySelector(fetcher.dataset.into);
      fetcher.disabled = true; fetcher.textContent = "Working…";
      get(fetcher.dataset.fetch).then(function (html) { into.innerHTML = html; })
        .catch(function (e) { into.textContent = "Failed: " + e.message; });
      return;
    }
    const copier = t.closest("[data-copy]");
    if (copier) {
      const source = document.querySelector(copier.dataset.copy);
      if (source && navigator.clipboard) {
        navigator.clipboard.writeText(source.textContent).then(function () { copier.textContent = "Copied"; });
      }
    }
  });
  document.addEventListener("keydown", function (event) {
    const t = event.target;
    if ((event.key === "Enter" || event.key === " ") && t instanceof Element && t.matches(".row[data-id]")) {
      event.preventDefault(); expand(t);
    }
  });

  // Live: poll a cheap fingerprint of the store; on a change, the timeline's first page
  // refreshes itself, other pages say so.
  function live() {
    const mode = document.body.dataset.live;
    const badge = document.getElementById("live");
    const count = document.getElementById("live-count");
    let first = null;
    function tick() {
      fetch("/api/pulse", { credentials: "same-origin" }).then(function (r) { return r.json(); }).then(function (p) {
        badge.classList.remove("down");
        count.textContent = "live · " + p.memories.toLocaleString() + " memories";
        const key = p.memories + "/" + p.newest;
        if (first === null) { first = key; return; }
        if (key === first) { return; }
        first = key;
        loadParts();
        const rows = document.getElementById("rows");
        if (mode === "refresh" && rows) {
          const known = new Set(Array.from(rows.querySelectorAll(".row[data-id]")).map(function (r) { return r.dataset.id; }));
          get(rows.dataset.refresh).then(function (html) {
            rows.innerHTML = html; widths(rows); watchMore();
            rows.querySelectorAll(".row[data-id]").forEach(function (r) { if (!known.has(r.dataset.id)) { r.classList.add("fresh"); } });
          });
        } else {
          const banner = document.getElementById("live-banner");
          document.getElementById("live-what").textContent = p.memories.toLocaleString() + " memories, newest " + p.newest;
          banner.hidden = false;
        }
      }).catch(function () { badge.classList.add("down"); count.textContent = "offline"; })
        .finally(function () { setTimeout(tick, POLL_MS); });
    }
    tick();
  }

  // Parts of a page that load after it (the overview's figures: stats() reads the index).
  function loadParts() {
    document.querySelectorAll("[data-load]").forEach(function (el) {
      get(el.dataset.load).then(function (html) { el.innerHTML = html; widths(el); })
        .catch(function (e) { el.textContent = "Could not load: " + e.message; });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    loadParts();
    widths(document);
    watchMore();
    live();
    const reload = document.getElementById("live-reload");
    if (reload) { reload.addEventListener("click", function (e) { e.preventDefault(); location.reload(); }); }
  });
})();
