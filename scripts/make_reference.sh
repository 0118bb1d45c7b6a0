#!/usr/bin/env bash
# Renders fixtures/reference/*.wav with espeak-ng + sox (apt-get install espeak-ng sox).
set -euo pipefail
cd "$(dirname "$0")/../fixtures/reference"
tmp=$(mktemp -d)
render() {  # name rate
  espeak-ng -v en-us -s "$2" -w "$tmp/$1.wav" "$(cat "$1.txt")"
  sox "$tmp/$1.wav" -r 24000 -b 16 "$1.wav"
  echo "$1.wav: $(soxi -D "$1.wav") s"
}
render ref_3s 145
render ref_6s 150
rm -rf "$tmp"
