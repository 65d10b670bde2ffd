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
        detail.innerHTML = html; detail.dataset.loaded = "1"; widths(detail); loadParts(detail);
      }).catch(function (e) { detail.textContent = "Could not load it: " + e.message; });
    }
  }

  // Timeline: the next page, from the index (before = the last id shown).
  function more(button) {
    button.disabled = true;
    button.textContent = "Loading…";
    get(button.dataset.url || "/timeline?partial=1&before=" + encodeURIComponent(button.dataset.next)).then(function (html) {
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

  // Live: poll a cheap fingerprint of the store (the count, the newest memory, the data
  // file's size, which every write changes: adds, pins, edits, forgets). On a change the
  // timeline's first page and a memory's page refresh themselves; other pages say so.
  function describe(before, now) {
    if (now.newest !== before.newest && now.memories > before.memories) {
      return "new memories: " + now.memories.toLocaleString() + ", newest " + now.newest;
    }
    if (now.memories < before.memories) { return "a memory was forgotten"; }
    return "a memory was changed (a pin, an edit, a forget or a supersede)";
  }

  function showBanner(what) {
    document.getElementById("live-what").textContent = what;
    document.getElementById("live-banner").hidden = false;
  }

  function refreshRows(rows) {
    const known = new Set(Array.from(rows.querySelectorAll(".row[data-id]")).map(function (r) { return r.dataset.id; }));
    get(rows.dataset.refresh).then(function (html) {
      rows.innerHTML = html; widths(rows); watchMore();
      rows.querySelectorAll(".row[data-id]").forEach(function (r) { if (!known.has(r.dataset.id)) { r.classList.add("fresh"); } });
    });
  }

  // A memory's page: its section again (pinned, importance, metadata, newer versions), or
  // a note that it is gone; left alone while the user types into one of its forms.
  function refreshMemory(section, what) {
    const typing = document.activeElement && section.contains(document.activeElement) &&
      document.activeElement.matches("input, textarea, select");
    if (typing) { showBanner(what); return; }
    fetch("/memory/" + encodeURIComponent(section.dataset.memory) + "?partial=page",
      { credentials: "same-origin", headers: { "Accept": "text/html" } }).then(function (r) {
      if (r.status === 404) {
        section.classList.add("gone");
        if (!section.querySelector(".gone-note")) {
          const note = document.createElement("p");
          note.className = "warn gone-note"; note.dataset.testid = "gone";
          note.textContent = "This memory was forgotten since the page was loaded.";
          section.prepend(note);
        }
        return null;
      }
      if (!r.ok) { throw new Error(r.status + " " + r.statusText); }
      return r.text();
    }).then(function (html) {
      if (html === null) { return; }
      const holder = document.createElement("div");
      holder.innerHTML = html;
      const fresh = holder.querySelector("[data-testid=memory]");
      if (!fresh) { return; }
      const open = section.querySelector("details.changes");
      if (open && open.open) { const d = fresh.querySelector("details.changes"); if (d) { d.open = true; } }
      // The older versions, once loaded, are kept: finding them again is a search, and a
      // write elsewhere in the store rarely changes them.
      const had = section.querySelector(".older[data-loaded]");
      const slot = fresh.querySelector(".older[data-load]");
      if (had && slot) { had.removeAttribute("data-load"); slot.replaceWith(had); }
      section.replaceWith(fresh); widths(fresh); loadParts(fresh);
    }).catch(function () { showBanner(what); });
  }

  function live() {
    const mode = document.body.dataset.live;
    const badge = document.getElementById("live");
    const count = document.getElementById("live-count");
    let last = null;
    function tick() {
      fetch("/api/pulse", { credentials: "same-origin" }).then(function (r) { return r.json(); }).then(function (p) {
        badge.classList.remove("down");
        count.textContent = "live · " + p.memories.toLocaleString() + " memories";
        const before = last;
        last = p;
        if (before === null || (before.memories === p.memories && before.newest === p.newest &&
            before.data_bytes === p.data_bytes)) { return; }
        const what = describe(before, p);
        document.querySelectorAll("#figures[data-load]").forEach(function (el) { loadParts(el.parentNode); });
        const rows = document.getElementById("rows");
        const section = document.querySelector("[data-testid=memory][data-memory]");
        if (mode === "refresh" && rows) {
          refreshRows(rows);
        } else if (mode === "memory" && section) {
          refreshMemory(section, what);
        } else {
          showBanner(what);
        }
      }).catch(function () { badge.classList.add("down"); count.textContent = "offline"; })
        .finally(function () { setTimeout(tick, POLL_MS); });
    }
    tick();
  }

  // Parts of a page that load after it: the overview's figures (stats() reads the index),
  // a memory's older versions (a search).
  function loadParts(root) {
    (root || document).querySelectorAll("[data-load]").forEach(function (el) {
      get(el.dataset.load).then(function (html) { el.innerHTML = html; el.dataset.loaded = "1"; widths(el); })
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
