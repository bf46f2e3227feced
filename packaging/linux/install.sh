#!/usr/bin/env bash
# Add a built bundle to this user's desktop menu (no root needed):
#   packaging/linux/install.sh [BUNDLE]    copy BUNDLE (default dist/specchat) to $XDG_DATA_HOME/specchat/app,
#                                          its icon into the hicolor theme and specchat.desktop into applications/
#   packaging/linux/install.sh --uninstall remove all three (models, chats and settings stay)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=${XDG_DATA_HOME:-$HOME/.local/share}
dest=$data/specchat/app
entry=$data/applications/specchat.desktop
icon=$data/icons/hicolor/scalable/apps/specchat.svg

if [ "${1:-}" = "--uninstall" ]; then
  rm -rf "$dest" "$entry" "$icon"
  echo "Removed SpecChat from the menu."
  exit 0
fi
bundle=${1:-$here/../../dist/specchat}
if [ ! -x "$bundle/specchat" ]; then
  echo "install.sh: no bundle at $bundle: build it first with packaging/build.sh" >&2
  exit 1
fi
# Copy beside the old install, then swap, so an interrupted copy never leaves a broken app.
mkdir -p "$(dirname "$dest")"
rm -rf "$dest.new"
cp -a "$bundle" "$dest.new"
rm -rf "$dest"
mv "$dest.new" "$dest"
install -Dm644 "$dest/_internal/assets/logo.svg" "$icon"
mkdir -p "$(dirname "$entry")"
sed "s|@EXEC@|$dest/specchat|" "$here/specchat.desktop" > "$entry.tmp"
mv "$entry.tmp" "$entry"
if command -v update-desktop-database >/dev/null; then update-desktop-database -q "$data/applications" || true; fi
echo "Installed: $entry (runs $dest/specchat)"
