/* The book's search scorer (html_search_scorer in conf.py; Sphinx puts it in language_data.js,
 * which the search page loads after searchtools.js).
 *
 * Sphinx's default scores rank an API entry whose name matches the query (11 + 5) above a
 * chapter that merely uses the word (5), and even above a page whose title is the word once
 * titles and text are merged. A reader of a book looks for the chapter first, so:
 *   - a page whose own title contains a word of the query (compared after stemming) gains 20,
 *     plus up to 10 more the larger the share of its title those words make;
 *   - chapters gain 2 over other pages at the same score;
 *   - API entries lose 10, so they follow the chapters that discuss the same name.
 * It also keeps raw TeX out of result snippets: math is replaced by an ellipsis before the
 * page's text is cut into a summary. */
var Scorer = {
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: { 0: 15, 1: 5, 2: -5 },
  objPrioDefault: 0,
  title: 15,
  partialTitle: 7,
  term: 5,
  partialTerm: 2,
  titleBoost: 20,
  chapterBoost: 2,
  objectPenalty: 10,

  _queryStems: null,
  queryStems: () => {
    if (Scorer._queryStems === null) {
      const query = new URLSearchParams(window.location.search).get("q") || "";
      const stemmer = typeof Stemmer === "undefined" ? null : new Stemmer();
      Scorer._queryStems = new Set(
        query.toLowerCase().split(/[^\p{Letter}\p{Number}_]+/u).filter((w) => w.length > 2)
          .map((w) => (stemmer ? stemmer.stemWord(w) : w)),
      );
    }
    return Scorer._queryStems;
  },

  // The share of the page title's letters in words the query names (0 when none): the
  // boost grows with it, so "Why attention" ranks above "Multi-head attention" for "attention".
  titleShare: (docname) => {
    const index = Search._index;
    const i = index.docnames.indexOf(docname);
    const stems = Scorer.queryStems();
    if (i < 0 || stems.size === 0) return 0;
    const stemmer = typeof Stemmer === "undefined" ? null : new Stemmer();
    const words = index.titles[i].toLowerCase().split(/[^\p{Letter}\p{Number}]+/u)
      .filter((w) => w);
    const total = words.reduce((n, w) => n + w.length, 0);
    const matched = words.filter((w) => stems.has(stemmer ? stemmer.stemWord(w) : w))
      .reduce((n, w) => n + w.length, 0);
    return total ? matched / total : 0;
  },

  score: (result) => {
    const [docname, , , , score, , kind] = result;
    if (kind === "object") return score - Scorer.objectPenalty;
    let total = score;
    const share = Scorer.titleShare(docname);
    if (share > 0) total += Scorer.titleBoost + Math.round(10 * share);
    if (docname.startsWith("chapters/")) total += Scorer.chapterBoost;
    return total;
  },
};

if (typeof Search !== "undefined" && !Search._tfMathStripped) {
  const htmlToText = Search.htmlToText;
  Search.htmlToText = (htmlString, anchor) => {
    const doc = new DOMParser().parseFromString(htmlString, "text/html");
    doc.querySelectorAll("div.math, .math-wrapper, .MathJax_Preview").forEach((el) => el.remove());
    doc.querySelectorAll(".math").forEach((el) => el.replaceWith("…"));
    return htmlToText(doc.documentElement.outerHTML, anchor);
  };
  Search._tfMathStripped = true;
}
