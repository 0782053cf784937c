// The slider figures of a page (fmlab.slider_figure), drawn from the widget state saved
// in the page, without a kernel and without the 4.4 MB ipywidgets manager: a slider
// figure is boxes, sliders, stacks of pre-rendered frames (images) and captions (HTML),
// and links from each slider's value to the stacks' selected child (jslink). This file
// (myst-nb adds it to the pages with a slider figure only) draws exactly that: each
// slider is an <input type="range">, and moving it shows the linked stacks' child. A
// frame's image loads when it is first shown, so the page moves only the frames a reader
// looks at. The page's text, formulas and figures do not wait for any of it.
(function () {
  var VIEW = 'script[type="application/vnd.jupyter.widget-view+json"]';
  var STATE = 'script[type="application/vnd.jupyter.widget-state+json"]';
  var PREFIX = /^IPY_MODEL_/;
  // the ipywidgets layout properties a slider figure uses, as CSS
  var LAYOUT = [
    "width", "max_width", "min_width", "height", "max_height", "min_height",
    "margin", "padding", "border", "flex", "flex_flow", "justify_content",
    "align_items", "align_content", "align_self", "overflow", "display", "order",
    "grid_gap",
  ];

  function models() {
    var all = {};
    document.querySelectorAll(STATE).forEach(function (s) {
      try {
        var state = JSON.parse(s.textContent).state || {};
        Object.keys(state).forEach(function (k) { all[k] = state[k]; });
      } catch (e) {}
    });
    return all;
  }

  function id(ref) {
    return String(ref).replace(PREFIX, "");
  }

  function firstSentence(text) {
    // the words, not the TeX of the caption's formulas (typeset or not yet)
    text = text.replace(/\\\(.*?\\\)/g, "").replace(/\s+([,.;:)])/g, "$1");
    text = text.replace(/\s+/g, " ").replace(/^\s*Fig\.\s*[\d.]+\s*/, "").trim();
    var m = text.match(/^.*?[.!?](?=\s|$)/);
    return m ? m[0] : text;
  }

  function Figure(all, root) {
    this.all = all;
    this.root = root;
    this.stacks = {}; // model id -> {children: [elements], select(i)}
    this.sliders = {}; // model id -> input element
    var figure = root.closest("figure");
    var caption = figure && figure.querySelector("figcaption");
    this.alt = caption ? firstSentence(caption.textContent) : "";
  }

  Figure.prototype.layout = function (el, model) {
    var ref = (model.state || {}).layout;
    var layout = ref && this.all[id(ref)];
    var state = (layout && layout.state) || {};
    LAYOUT.forEach(function (k) {
      var v = state[k];
      if (v !== null && v !== undefined && v !== "") {
        el.style.setProperty(k === "grid_gap" ? "gap" : k.replace(/_/g, "-"), v);
      }
    });
    ((model.state || {})._dom_classes || []).forEach(function (c) { el.classList.add(c); });
  };

  Figure.prototype.draw = function (ref) {
    var key = id(ref);
    var model = this.all[key];
    if (!model) return null;
    var state = model.state || {};
    var self = this;
    var el;
    switch (model.model_name) {
      case "VBoxModel":
      case "HBoxModel":
      case "BoxModel":
        el = document.createElement("div");
        el.className = "widget-container widget-box " +
          (model.model_name === "HBoxModel" ? "widget-hbox" : "widget-vbox");
        (state.children || []).forEach(function (c) {
          var child = self.draw(c);
          if (child) el.appendChild(child);
        });
        break;
      case "StackModel":
        el = document.createElement("div");
        el.className = "widget-container widget-stack";
        var children = (state.children || []).map(function (c) {
          var child = self.draw(c) || document.createElement("div");
          el.appendChild(child);
          return child;
        });
        var stack = {
          select: function (i) {
            children.forEach(function (child, j) {
              child.style.display = j === i ? "" : "none";
            });
            self.reveal();
          },
        };
        this.stacks[key] = stack;
        stack.select(state.selected_index);
        break;
      case "ImageModel":
        el = document.createElement("img");
        el.className = "widget-image";
        var buffer = (model.buffers || [])[0];
        if (buffer && state.format === "url") {
          // shown: loads now (lazily, near the screen); hidden: when first shown
          el.setAttribute("data-src", atob(buffer.data));
        }
        el.loading = "lazy";
        if (state.width) el.setAttribute("width", state.width);
        el.alt = this.alt;
        break;
      case "HTMLModel":
      case "LabelModel":
        el = document.createElement("div");
        el.className = "widget-inline-hbox widget-html";
        var content = document.createElement("div");
        content.className = "widget-html-content";
        if (model.model_name === "HTMLModel") content.innerHTML = state.value || "";
        else content.textContent = state.value || "";
        el.appendChild(content);
        break;
      case "IntSliderModel":
        el = document.createElement("div");
        el.className = "widget-inline-hbox widget-slider widget-hslider";
        var label = document.createElement("label");
        label.className = "widget-label";
        label.textContent = state.description || "";
        var input = document.createElement("input");
        input.type = "range";
        input.min = state.min;
        input.max = state.max;
        input.step = state.step || 1;
        input.value = state.value;
        input.setAttribute("aria-label", state.description || "slider");
        input.addEventListener("input", function () {
          self.move(key, parseInt(input.value, 10));
        });
        label.appendChild(input);
        el.appendChild(label);
        this.sliders[key] = input;
        break;
      default:
        return null;
    }
    el.classList.add("jupyter-widgets");
    this.layout(el, model);
    return el;
  };

  // every frame now shown gets its image (a frame loads when it is first shown)
  Figure.prototype.reveal = function () {
    var root = this.root;
    root.querySelectorAll("img[data-src]").forEach(function (img) {
      for (var p = img; p && p !== root; p = p.parentElement) {
        if (p.style.display === "none") return;
      }
      img.src = img.getAttribute("data-src");
      img.removeAttribute("data-src");
    });
  };

  // a slider moved: every stack linked to its value shows that child
  Figure.prototype.move = function (slider, value) {
    var self = this;
    Object.keys(this.all).forEach(function (k) {
      var m = self.all[k];
      if (m.model_name !== "LinkModel" && m.model_name !== "DirectionalLinkModel") return;
      var s = m.state || {};
      if (!s.source || !s.target || id(s.source[0]) !== slider) return;
      var stack = self.stacks[id(s.target[0])];
      if (stack && s.source[1] === "value" && s.target[1] === "selected_index") {
        stack.select(value);
      }
    });
  };

  function typeset(el) {
    var mj = window.MathJax;
    if (mj && typeof mj.typesetPromise === "function") {
      mj.typesetPromise([el]).catch(function () {});
    } else if (mj && mj.startup && mj.startup.promise) {
      mj.startup.promise.then(function () { typeset(el); });
    }
  }

  function start() {
    var views = document.querySelectorAll(VIEW);
    if (!views.length) return;
    var all = models();
    views.forEach(function (view) {
      var ref;
      try { ref = JSON.parse(view.textContent).model_id; } catch (e) { return; }
      var holder = document.createElement("div");
      holder.className = "widget-subarea fmlab-widget";
      view.parentNode.insertBefore(holder, view);
      var figure = new Figure(all, holder);
      var el = figure.draw(ref);
      if (!el) return;
      holder.appendChild(el);
      figure.reveal();
      if (/\\\(|\$/.test(holder.innerHTML)) typeset(holder);
    });
    // when the sliders were drawn (the browser test reads it)
    window.fmlabSlidersDrawnAt = window.fmlabSlidersDrawnAt || performance.now();
  }
  // Loaded async: draw as soon as the page is parsed ("interactive"), without waiting
  // for the deferred scripts (MathJax is over a megabyte), which DOMContentLoaded does.
  // Formulas in a slider's labels are typeset by MathJax's own first pass when it
  // starts after the sliders are drawn, or by typeset() when it started before.
  if (document.readyState === "loading") {
    document.addEventListener("readystatechange", function once() {
      if (document.readyState === "loading") return;
      document.removeEventListener("readystatechange", once);
      start();
    });
  } else {
    start();
  }
  window.fmlabDrawSliders = start;
})();
