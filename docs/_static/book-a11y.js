/* Wide equations scroll sideways in their own box on a narrow screen (book.css). A box that
 * scrolls must be reachable by keyboard, so it gets tabindex="0" while it scrolls (the theme
 * does the same for code blocks, outputs and tables, but not for display math). Checked after
 * MathJax has typeset the page and again, 300 ms after the last change, when the window is
 * resized. */
(() => {
  "use strict";
  const SCROLLERS = ".bd-article div.math";
  const update = () => {
    for (const el of document.querySelectorAll(SCROLLERS)) {
      if (el.scrollWidth > el.clientWidth + 1) {
        el.tabIndex = 0;
      } else if (el.tabIndex === 0) {
        el.removeAttribute("tabindex");
      }
    }
  };
  let timer = null;
  const later = () => {
    clearTimeout(timer);
    timer = setTimeout(update, 300);
  };
  const start = () => {
    update();
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(update);
    }
    window.addEventListener("resize", later);
  };
  if (document.readyState === "complete") start();
  else window.addEventListener("load", start);
})();
