#!/usr/bin/env bash
# Link this checkout's Snakemake profiles into the user's Snakemake config folder, so
# `snakemake --profile slurm-amd` works as typed from any directory. Snakemake 9 resolves a
# bare profile name in the current directory, then platformdirs' user config folder
# ($XDG_CONFIG_HOME/snakemake, default ~/.config/snakemake), then /etc/xdg/snakemake.
#
#   scripts/install-profiles.sh            # link every profile except default/
#   scripts/install-profiles.sh --check    # say where each profile resolves, change nothing
#
# default/ is not linked: Snakemake already uses it as the workflow profile of this repo.
# A link to another checkout's profiles/<name> (an older clone, a CI workspace) is repointed
# here; any other existing entry is left alone and reported (exit 1).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${XDG_CONFIG_HOME:-$HOME/.config}/snakemake"
mode="${1:-install}"

case "$mode" in
  install|--check) ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

[ "$mode" = install ] && mkdir -p "$target"
status=0
for dir in "$repo"/profiles/*/; do
  name="$(basename "$dir")"
  [ "$name" = default ] && continue
  src="${dir%/}"
  dest="$target/$name"
  if [ -L "$dest" ] && [ "$(readlink "$dest")" = "$src" ]; then
    echo "ok      $dest -> $src"
  elif [ "$mode" = install ] && [ -L "$dest" ] && [[ "$(readlink "$dest")" == */profiles/"$name" ]]; then
    ln -sfn "$src" "$dest"
    echo "relinked $dest -> $src (was another checkout's)"
  elif [ -e "$dest" ] || [ -L "$dest" ]; then
    echo "skipped $dest exists and is not a link to $src; remove it and rerun" >&2
    status=1
  elif [ "$mode" = --check ]; then
    echo "missing $dest (run $0)" >&2
    status=1
  else
    ln -s "$src" "$dest"
    echo "linked  $dest -> $src"
  fi
done
exit "$status"
