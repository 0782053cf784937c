// A tap or click on a figure opens it at full size, over the page (on a phone a figure
// is shown at about half its drawn width, so its 10-px text becomes hard to read).
// Another tap, or Escape, closes it. Figures of slider widgets are left alone.
(function () {
  function open(img) {
    var layer = document.createElement("div");
    layer.className = "fmlab-figure-zoom";
    layer.setAttribute("role", "dialog");
    layer.setAttribute("aria-label", "Figure at full size (tap to close)");
    var big = document.createElement("img");
    big.src = img.currentSrc || img.src;
    big.alt = img.alt || "";
    // the figures are 2x PNGs: full size is their drawn width in CSS pixels
    var drawn =
      parseFloat(img.style.width) ||
      parseFloat(img.getAttribute("width")) ||
      img.naturalWidth / 2;
    big.style.width = drawn + "px";
    layer.appendChild(big);
    function close() {
      layer.remove();
      document.removeEventListener("keydown", onKey);
    }
    function onKey(e) {
      if (e.key === "Escape") close();
    }
    layer.addEventListener("click", close);
    document.addEventListener("keydown", onKey);
    document.body.appendChild(layer);
  }
  document.addEventListener("click", function (e) {
    var img = e.target;
    if (!(img instanceof HTMLImageElement)) return;
    if (!img.closest(".cell_output") || img.closest(".jupyter-widgets")) return;
    var link = img.closest("a");
    // Sphinx links a sized figure to its PNG: open it over the page instead
    if (link && !link.classList.contains("image-reference")) return;
    e.preventDefault();
    open(img);
  });
})();
