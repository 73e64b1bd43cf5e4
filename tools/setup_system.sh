#!/usr/bin/env bash
# Installs the system programs deferdump's tests need, through apt, when they are missing.
# Usage: tools/setup_system.sh PROGRAM=PACKAGE ...   e.g. java=openjdk-17-jre-headless chromium=chromium
# Only as root on Debian/Ubuntu (apt-get present); otherwise stops with one line naming what to install.
set -euo pipefail
missing_programs=()
missing_packages=()
for pair in "$@"; do
  program=${pair%%=*}
  package=${pair#*=}
  command -v "$program" >/dev/null 2>&1 || { missing_programs+=("$program"); missing_packages+=("$package"); }
done
[ ${#missing_packages[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "make setup: missing ${missing_programs[*]}: install the Debian packages ${missing_packages[*]} (or equivalents) and rerun" >&2
  exit 1
fi
echo "make setup: installing ${missing_packages[*]} with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing_packages[@]}" >/dev/null
for program in "${missing_programs[@]}"; do
  command -v "$program" >/dev/null 2>&1 || { echo "make setup: $program still not found after apt-get install" >&2; exit 1; }
done
