#!/usr/bin/env bash
# Installs the Debian 12 packages tessera builds and tests with (as root).
set -euo pipefail
pkgs="build-essential cmake pkg-config libyaml-dev liblua5.4-dev libffi-dev libcmocka-dev
      libmicrohttpd-dev libjansson-dev libpcre2-dev libopenblas-dev libcurl4-openssl-dev curl
      python3-numpy"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
# the server's end-to-end test drives it with the official openai client from npm
command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
if [ -n "$missing" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing
fi
