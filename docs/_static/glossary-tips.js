/* Glossary definitions beside the terms that use them (docs/_ext/glossary_tips.py puts each
 * page's definitions in hidden role="tooltip" elements at the end of its body).
 *
 * Each link to a glossary term gets aria-describedby pointing at its definition, and the
 * definition is shown next to the link while the pointer is over the link or the definition
 * (so it can be read and selected), or while the link has keyboard focus. Escape hides it. */
(() => {
  "use strict";
  const PREFIX = "tf-tip-";
  let shown = null; // { tip, link }
  let hideTimer = null;

  const place = (tip, link) => {
    const box = link.getBoundingClientRect();
    const width = Math.min(360, document.documentElement.clientWidth - 16);
    tip.style.maxWidth = `${width}px`;
    const left = Math.max(8, Math.min(box.left, document.documentElement.clientWidth - width - 8));
    tip.style.left = `${left}px`;
    const below = box.bottom + 6;
    tip.style.top = `${below}px`;
    const height = tip.getBoundingClientRect().height;
    if (below + height > window.innerHeight && box.top - height - 6 > 0) {
      tip.style.top = `${box.top - height - 6}px`;
    }
  };

  const hide = () => {
    clearTimeout(hideTimer);
    if (shown) {
      shown.tip.hidden = true;
      shown.tip.classList.remove("tf-tip-shown");
      shown = null;
    }
  };

  const show = (tip, link) => {
    clearTimeout(hideTimer);
    if (shown && shown.tip !== tip) hide();
    tip.hidden = false;
    tip.classList.add("tf-tip-shown");
    shown = { tip, link };
    place(tip, link);
  };

  const hideSoon = () => {
    clearTimeout(hideTimer);
    hideTimer = setTimeout(() => {
      if (shown && !shown.tip.matches(":hover") && document.activeElement !== shown.link) hide();
    }, 250);
  };

  const init = () => {
    for (const link of document.querySelectorAll('a[href*="glossary.html#term-"]')) {
      const id = PREFIX + decodeURIComponent(link.hash.slice(1));
      const tip = document.getElementById(id);
      if (!tip) continue;
      link.setAttribute("aria-describedby", id);
      link.classList.add("tf-term");
      link.addEventListener("mouseenter", () => show(tip, link));
      link.addEventListener("focus", () => show(tip, link));
      link.addEventListener("mouseleave", hideSoon);
      link.addEventListener("blur", hideSoon);
      if (!tip.dataset.tfBound) {
        tip.dataset.tfBound = "1";
        tip.addEventListener("mouseenter", () => clearTimeout(hideTimer));
        tip.addEventListener("mouseleave", hideSoon);
      }
    }
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape") hide();
    });
    window.addEventListener("scroll", () => { if (shown) place(shown.tip, shown.link); }, { passive: true });
    window.addEventListener("resize", hide);
  };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
