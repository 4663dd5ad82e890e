// runstream UI: the time-travel slider (and the links that move it) and the dry-run button.
// No build step, no library.
"use strict";

(function () {
  const slider = document.getElementById("record-slider");
  if (slider) {
    setUpSlider(slider);
  }
  const dryRun = document.getElementById("dry-run-button");
  if (dryRun) {
    dryRun.addEventListener("click", () => runDryRun(dryRun));
  }

  function setUpSlider(input) {
    const panel = document.getElementById("state");
    const label = document.getElementById("record-label");
    const max = Number(input.max);
    let pending = null; // the AbortController of the request in flight
    let timer = 0;

    // Moves the slider to `record` and loads the state there (debounced while dragging).
    function show(record) {
      const value = Math.min(max, Math.max(1, record));
      input.value = String(value);
      label.textContent = `record ${value} of ${max}`;
      markTimeline(value);
      clearTimeout(timer);
      timer = setTimeout(() => load(value), 60);
    }

    async function load(record) {
      if (pending) {
        pending.abort();
      }
      const controller = new AbortController();
      pending = controller;
      panel.setAttribute("aria-busy", "true");
      try {
        const url = `${input.dataset.stateUrl}&record=${record}`;
        const response = await fetch(url, { signal: controller.signal });
        panel.innerHTML = await response.text();
        panel.dataset.record = String(record);
        const address = new URL(window.location.href);
        address.searchParams.set("record", String(record));
        window.history.replaceState(null, "", address);
      } catch (error) {
        if (error.name !== "AbortError") {
          showError(panel, error);
        }
      } finally {
        if (pending === controller) {
          pending = null;
          panel.removeAttribute("aria-busy");
        }
      }
    }

    function markTimeline(record) {
      for (const row of document.querySelectorAll("table.records tr[data-record]")) {
        const number = Number(row.dataset.record);
        row.classList.toggle("selected", number === record);
        row.classList.toggle("later", number > record);
      }
    }

    input.addEventListener("input", () => show(Number(input.value)));
    document.querySelector(".step-back").addEventListener("click",
      () => show(Number(input.value) - 1));
    document.querySelector(".step-forward").addEventListener("click",
      () => show(Number(input.value) + 1));
    for (const link of document.querySelectorAll("a.to-record")) {
      link.addEventListener("click", (event) => {
        event.preventDefault();
        show(Number(link.closest("tr").dataset.record));
        input.scrollIntoView({ block: "nearest", behavior: "smooth" });
      });
    }
    // A link to a record (an attribute's "set by", an update's request or outcome): the
    // slider to that record, its timeline row in view (without a script the link loads the
    // page at that record and row).
    for (const link of document.querySelectorAll("a.record-link[data-record]")) {
      link.addEventListener("click", (event) => {
        event.preventDefault();
        const record = Number(link.dataset.record);
        show(record);
        const row = document.getElementById(`record-${record}`);
        (row || input).scrollIntoView({ block: "center", behavior: "smooth" });
      });
    }
    // Left and right arrows step through the records (the slider itself handles its own).
    document.addEventListener("keydown", (event) => {
      const target = event.target;
      if (target instanceof HTMLInputElement || target instanceof HTMLSelectElement) {
        return;
      }
      if (event.key === "ArrowLeft") {
        show(Number(input.value) - 1);
      } else if (event.key === "ArrowRight") {
        show(Number(input.value) + 1);
      }
    });
  }

  // The server's own error fragments arrive as HTML; a failed fetch is shown as text.
  function showError(element, error) {
    const line = document.createElement("p");
    line.className = "error message";
    line.textContent = String(error);
    element.replaceChildren(line);
  }

  async function runDryRun(button) {
    const target = document.getElementById("dry-run-result");
    button.disabled = true;
    target.innerHTML = '<p class="muted">Replaying…</p>';
    try {
      const response = await fetch(button.dataset.url);
      target.innerHTML = await response.text();
    } catch (error) {
      showError(target, error);
    } finally {
      button.disabled = false;
    }
  }
})();
