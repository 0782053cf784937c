#!/usr/bin/env bash
# Fetch the third-party web asset that the rendered book serves itself, so that its pages
# make no request to another host: MathJax. (The slider figures are drawn without a
# kernel by the book's own assets/fmlab-widgets.js, so neither require.js nor the
# ipywidgets HTML manager is served.) It comes from the npm registry at a pinned
# version, is checked against a pinned SHA-256 sum, and is unpacked into
# _webassets/vendor/ (ignored by git; served as _static/vendor/). Called by `make book`;
# does nothing when up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

dest=_webassets/vendor
# name@version  sha256 of the registry tarball
pins=(
  "mathjax@3.2.2 1b9c0a1c44df864e915690558e72adb9cc5203360daefd385084ced3b6c64c09"
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

rm -rf "$dest" && mkdir -p "$dest/mathjax"
# MathJax: the combined TeX+MathML/CHTML component and what it loads on demand (no speech engine)
src="$tmp/mathjax/package/es5"
cp "$src/tex-mml-chtml.js" "$dest/mathjax/"
for d in a11y adaptors input output ui; do cp -r "$src/$d" "$dest/mathjax/"; done
cp "$tmp/mathjax/package/LICENSE" "$dest/mathjax/"
echo "$want" > "$dest/.pins"
echo "web_assets.sh: web assets ready in $dest ($(du -sh "$dest" | cut -f1))"
