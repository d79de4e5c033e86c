// The account console's few behaviours (gateway/gw_console.h). The page works without
// them: its buttons are forms that post to /account. Served from this origin only
// (/account/console.js), under a CSP that runs no inline script.
"use strict";

// Copy: the text of the element a button names (data-copy), to the clipboard.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const source = document.getElementById(button.dataset.copy);
  if (!source) return;
  try {
    await navigator.clipboard.writeText(source.textContent);
    button.textContent = "Copied";
  } catch (e) {
    // No clipboard here (an old browser, plain http): select it for Ctrl+C instead.
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    button.textContent = "Selected: press Ctrl+C";
  }
  setTimeout(() => { button.textContent = "Copy"; }, 3000);
});

// Deletes ask first (data-confirm on the button).
document.addEventListener("submit", (event) => {
  const question = event.submitter && event.submitter.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});
