#!/usr/bin/env bash
# Fetch the third-party web assets that the rendered book serves itself, so that its pages
# make no request to another host: MathJax, require.js and the ipywidgets HTML manager
# (which renders the slider figures without a kernel). They come from the npm registry at
# pinned versions, are checked against pinned SHA-256 sums, and are unpacked into
# _webassets/vendor/ (ignored by git; served as _static/vendor/). Called by `make book`; does nothing when up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

dest=_webassets/vendor
# name@version  sha256 of the registry tarball
pins=(
  "mathjax@3.2.2 1b9c0a1c44df864e915690558e72adb9cc5203360daefd385084ced3b6c64c09"
  "requirejs@2.3.7 31f3330c978fb28684622fe71165dc946432cf0210b2ea8a1ca0233e70f2737d"
  "@jupyter-widgets/html-manager@1.0.6 6c198ceb99ba7e7526990a1de16e8147ad7d3a714e3fb06741183623c04b5f6e"
)
want=$(printf '%s\n' "${pins[@]}")
if [ -f "$dest/.pins" ] && [ "$(cat "$dest/.pins")" = "$want" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "web_assets.sh: npm is needed to fetch the book's web assets" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for pin in "${pins[@]}"; do
  spec=${pin% *}; sum=${pin#* }
  file=$(cd "$tmp" && npm pack --silent --loglevel=error "$spec" 2>/dev/null | tail -n 1)
  echo "$sum  $tmp/$file" | sha256sum --check --quiet - || { echo "web_assets.sh: checksum mismatch for $spec" >&2; exit 1; }
  name=${spec%@*}; name=${name##*/}
  mkdir -p "$tmp/$name" && tar xzf "$tmp/$file" -C "$tmp/$name"
done

rm -rf "$dest" && mkdir -p "$dest/mathjax" "$dest/html-manager"
# MathJax: the combined TeX+MathML/CHTML component and what it loads on demand (no speech engine)
src="$tmp/mathjax/package/es5"
cp "$src/tex-mml-chtml.js" "$dest/mathjax/"
for d in a11y adaptors input output ui; do cp -r "$src/$d" "$dest/mathjax/"; done
cp "$tmp/mathjax/package/LICENSE" "$dest/mathjax/"
# require.js (the widget manager is an AMD module)
cp "$tmp/requirejs/package/require.js" "$dest/"
# the ipywidgets HTML manager and the fonts its CSS points to (no source maps)
src="$tmp/html-manager/package/dist"
cp "$src/embed-amd.js" "$src"/*.embed.js "$dest/html-manager/"
cp "$src"/*.woff "$src"/*.woff2 "$src"/*.ttf "$src"/*.eot "$src"/*.svg "$dest/html-manager/"
cp "$tmp/html-manager/package/LICENSE" "$dest/html-manager/"
echo "$want" > "$dest/.pins"
echo "web_assets.sh: web assets ready in $dest ($(du -sh "$dest" | cut -f1))"
