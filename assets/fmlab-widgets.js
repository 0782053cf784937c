// Glue between the ipywidgets HTML manager and this site; loaded before the manager.
(function () {
  // 1. The bundle defines four AMD modules (base, controls, html-manager and the embedder),
  //    and each loads its icon fonts and code chunks relative to its own module URL, which
  //    require.js would otherwise resolve against the page's folder. Map all four into
  //    this site's _static/vendor copy, so that slider figures render offline with every
  //    file served by the book itself.
  var here = document.currentScript.src.replace(/[^/]*$/, "");
  var vendor = here + "vendor/html-manager";
  require.config({
    paths: {
      "@jupyter-widgets/html-manager/dist": vendor,
      "@jupyter-widgets/html-manager": vendor + "/html-manager",
      "@jupyter-widgets/base": vendor + "/base",
      "@jupyter-widgets/controls": vendor + "/controls",
    },
  });

  // 2. The widgets typeset their labels with the MathJax 2 call MathJax.Hub.Queue, but
  //    the book uses MathJax 3, which has no Hub. Give every object that becomes
  //    window.MathJax (Sphinx's config object, then MathJax 3 itself) a small Hub that
  //    forwards to MathJax 3's typesetPromise, so rendering a widget raises no error.
  function addHub(mj) {
    if (mj && typeof mj === "object" && !mj.Hub) {
      Object.defineProperty(mj, "Hub", {
        configurable: true,
        enumerable: false,
        value: {
          Queue: function (job) {
            var el = Array.isArray(job) ? job[2] : undefined;
            var m = window.MathJax;
            if (m && typeof m.typesetPromise === "function") {
              m.typesetPromise(el ? [el] : undefined).catch(function () {});
            }
          },
        },
      });
    }
    return mj;
  }
  var current = addHub(window.MathJax);
  Object.defineProperty(window, "MathJax", {
    configurable: true,
    get: function () { return current; },
    set: function (value) { current = addHub(value); },
  });
})();
